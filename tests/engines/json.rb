# json.rb - N records (numbers, strings with characters to escape, arrays, nested objects) encoded as
# JSON by a recursive encoder (keys sorted, as json.lua must), then the text scanned back into a count of
# its values. The host sets N and print (tests/engine.h); json.lua and json.js do the same in their languages.
ESCAPES = {'"' => '\\"', '\\' => '\\\\', "\n" => '\\n', "\t" => '\\t'}

def quote(s)
  out = '"'
  s.each_char { |c| out << (ESCAPES[c] || c) }
  out << '"'
end

def encode_into(v, out)
  case v
  when Array
    out << "["
    v.each_with_index do |x, i|
      out << "," if i > 0
      encode_into(x, out)
    end
    out << "]"
  when Hash
    out << "{"
    v.keys.map(&:to_s).sort.each_with_index do |k, i|
      out << "," if i > 0
      out << quote(k) << ":"
      encode_into(v[k.to_sym], out)
    end
    out << "}"
  when String
    out << quote(v)
  when nil
    out << "null"
  else
    out << v.to_s
  end
end

def encode(v)
  out = []
  encode_into(v, out)
  out.join
end

records = []
i = 1
while i <= N
  records << {
    id: i,
    name: "user#{i}",
    note: i % 10 == 0 ? "says \"hi\"\tand\\leaves\n" : "plain",
    tags: ["t#{i % 7}", "t#{i % 11}", "t#{i % 13}"],
    score: i * 0.25,
    active: i % 3 == 0,
    nested: {a: i, b: [i, i + 1, {deep: "x#{i}"}]}
  }
  i += 1
end
text = encode({count: N, records: records})
values = text.count(":[,")
hash = 0
i = 0
while i < text.length
  hash = (hash * 31 + text.getbyte(i)) % 1000000007
  i += 61
end
puts ["json", N, text.length, values, hash, text[0, 72]].join("\t")
