// strings.js - N pieces "i:hex;" concatenated one at a time into 4 KB chunks, the chunks joined, the
// result split into its N words, upper-cased and reversed in slices, hashed.
// The host sets N and print (tests/engine.h); strings.lua and strings.rb do the same in their languages.
var chunks = [], s = "";
for (var i = 1; i <= N; i++) {
  s = s + i + ":" + (i * 7919).toString(16) + ";";
  if (s.length >= 4096) { chunks.push(s); s = ""; }
}
chunks.push(s);
var all = chunks.join("");
var parts = all.split(";"), words = 0, letters = 0;
for (var i = 0; i < parts.length; i++) {
  if (parts[i].length === 0) continue;
  words++;
  letters += parts[i].toUpperCase().length;
}
var slices = [];
for (var i = 0; i < all.length; i += 1000) slices.push(all.substring(i, i + 1000).split("").reverse().join(""));
var back = slices.join("|");
var hash = 0;
for (var i = 0; i < all.length; i += 97) hash = (hash * 31 + all.charCodeAt(i)) % 1000000007;
print("strings", chunks.length, all.length, words, letters, back.length, hash, all.substring(0, 24),
      back.substring(back.length - 24));
