# bench/programs/records.rb - Ruby structs, strings, arrays and hashes, run by bench/programs.py.
#
# Usage: ruby records.rb SCALE. The shape of a Rails-style batch job, the kind of Ruby 3.1 script on
# which issue 25 saw shardmm's peak RSS at 167 MB against 114-118 MB for mimalloc and glibc: rows as
# Structs in a big array, indexed and grouped in hashes, rendered three ways into a report string
# grown by << to 6 MB, which an archive string that lives to the end takes in round after round
# (18 MB at the end), split back into an array of lines, sorted and joined into another big string,
# and an array of numbers grown by << to 1.2 million elements and packed; each round's structures
# are garbage in the next. At scale 1 the peak RSS is about 120 MB under glibc, and the figure to
# watch: it is set by how the allocator reuses the big strings and arrays the collector frees and
# grows the ones that live. Deterministic: prints the counts and a CRC-32 of everything rendered,
# the same under every allocator.
require "zlib"

Row = Struct.new(:id, :name, :email, :tags, :score, :notes)

scale = (ARGV[0] || "1").to_f
count = [1, (30_000 * scale).round].max
crc = 0
kept = []
archive = +""

3.times do |round|
  rows = Array.new(count) do |i|
    n = i * 7919 + round * 104_729
    name = "user#{i}-#{n % 10_007}"
    Row.new(i, name, "#{name}@example#{n % 97}.org", ["t#{n % 7}", "u#{n % 13}", "v#{n % 29}"].take(1 + i % 3),
            n % 1000, "note " * (i % 9))
  end
  by_email = {}
  rows.each { |r| by_email[r.email] = r }
  groups = Hash.new { |h, k| h[k] = [] }
  rows.each { |r| groups[r.tags.first] << r }

  report = +""
  rows.each do |r|
    report << r.id.to_s << "," << r.name << "," << r.email << "," << r.tags.join("|") << "," << r.score.to_s << "\n"
  end
  rows.each { |r| report << format("%08d %-24s %6d %s\n", r.id, r.name, r.score, r.notes) }
  rows.each { |r| report << "<row id=\"#{r.id}\" email=\"#{r.email}\">#{r.notes}#{r.tags.join(' ')}</row>\n" }
  crc = Zlib.crc32(report, crc)
  archive << report

  lines = report.split("\n")
  sorted = lines.sort_by { |line| [line.size, line] }
  joined = sorted.reverse.join("\n")
  crc = Zlib.crc32(joined, crc)

  json = +"["
  groups.keys.sort.each do |tag|
    members = groups[tag]
    json << "{\"tag\":\"#{tag}\",\"count\":#{members.size},\"ids\":[" << members.map(&:id).join(",") << "]},"
  end
  json << "]"
  crc = Zlib.crc32(json, crc)

  numbers = []
  (count * 40).times { |i| numbers << (i * 2_654_435_761 + round) % 4_294_967_296 }
  crc = Zlib.crc32(numbers.pack("Q*"), crc)
  kept << rows.select { |r| r.score == round }.map(&:name) << by_email.size
end

puts [count, kept.size, archive.size, crc].join(" ")
