// oom.js - allocates without bound: strings of about 110 bytes kept in an array, until the engine's
// memory is refused ("Error: alloc failed"). The host runs it under a heap's limit (tests/test_engines.c).
var a = [], s = "";
for (var j = 0; j < 100; j++) s += "x";
for (var i = 0; ; i++) a.push(s + i);
