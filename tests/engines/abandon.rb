# abandon.rb - N strings of about 110 bytes and N small arrays kept in a global, then an error that ends
# the script there: the host drops the engine without closing it (tests/test_engines.c).
$kept = []
s = "y" * 100
i = 1
while i <= N
  $kept << [s + i.to_s, i]
  i += 1
end
raise "abandoned after #{N} entries"
