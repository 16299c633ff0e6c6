// abandon.js - N strings of about 110 bytes and N small arrays kept in a global, then an error that ends
// the script there: the host drops the engine without closing it (tests/test_engines.c).
var kept = [], s = "";
for (var j = 0; j < 100; j++) s += "y";
for (var i = 1; i <= N; i++) kept.push([s + i, i]);
throw new Error("abandoned after " + N + " entries");
