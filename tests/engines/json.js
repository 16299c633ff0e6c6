// json.js - N records (numbers, strings with characters to escape, arrays, nested objects) encoded as
// JSON by a recursive encoder (keys sorted, as json.lua must), then the text scanned back into a count of
// its values. The host sets N and print (tests/engine.h); json.lua and json.rb do the same in their languages.
var escapes = {'"': '\\"', '\\': '\\\\', '\n': '\\n', '\t': '\\t'};
function quote(s) { return '"' + s.replace(/["\\\n\t]/g, function (c) { return escapes[c]; }) + '"'; }

function encodeInto(v, out) {
  if (Array.isArray(v)) {
    out.push("[");
    for (var i = 0; i < v.length; i++) {
      if (i > 0) out.push(",");
      encodeInto(v[i], out);
    }
    out.push("]");
  } else if (v !== null && typeof v === "object") {
    var keys = Object.keys(v).sort();
    out.push("{");
    for (var i = 0; i < keys.length; i++) {
      if (i > 0) out.push(",");
      out.push(quote(keys[i]), ":");
      encodeInto(v[keys[i]], out);
    }
    out.push("}");
  } else if (typeof v === "string") {
    out.push(quote(v));
  } else if (v === null || v === undefined) {
    out.push("null");
  } else {
    out.push(String(v));
  }
}
function encode(v) { var out = []; encodeInto(v, out); return out.join(""); }

var records = [];
for (var i = 1; i <= N; i++) {
  records.push({
    id: i,
    name: "user" + i,
    note: i % 10 === 0 ? 'says "hi"\tand\\leaves\n' : "plain",
    tags: ["t" + (i % 7), "t" + (i % 11), "t" + (i % 13)],
    score: i * 0.25,
    active: i % 3 === 0,
    nested: {a: i, b: [i, i + 1, {deep: "x" + i}]}
  });
}
var text = encode({count: N, records: records});
var values = 0;
for (var i = 0; i < text.length; i++) {
  var c = text.charCodeAt(i);
  if (c === 58 || c === 91 || c === 44) values++; /* : [ , */
}
var hash = 0;
for (var i = 0; i < text.length; i += 61) hash = (hash * 31 + text.charCodeAt(i)) % 1000000007;
print("json", N, text.length, values, hash, text.substring(0, 72));
