# strings.rb - N pieces "i:hex;" concatenated one at a time into 4 KB chunks, the chunks joined, the
# result split into its N words, upper-cased and reversed in slices, hashed.
# The host sets N and print (tests/engine.h); strings.lua and strings.js do the same in their languages.
chunks = []
s = ""
i = 1
while i <= N
  s = s + "#{i}:#{(i * 7919).to_s(16)};"
  if s.length >= 4096
    chunks << s
    s = ""
  end
  i += 1
end
chunks << s
all = chunks.join
words = 0
letters = 0
all.split(";").each do |w|
  next if w.empty?
  words += 1
  letters += w.upcase.length
end
slices = []
i = 0
while i < all.length
  slices << all[i, 1000].reverse
  i += 1000
end
back = slices.join("|")
hash = 0
i = 0
while i < all.length
  hash = (hash * 31 + all.getbyte(i)) % 1000000007
  i += 97
end
puts ["strings", chunks.length, all.length, words, letters, back.length, hash, all[0, 24], back[-24, 24]].join("\t")
