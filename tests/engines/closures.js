// closures.js - N counters, each a closure over its own variable, called in rounds; closures composed
// 100 deep and called; a memoising closure over a table.
// The host sets N and print (tests/engine.h); closures.lua and closures.rb do the same in their languages.
function counter(start) {
  var c = start;
  return function (step) { c += step; return c; };
}
var counters = [];
for (var i = 1; i <= N; i++) counters.push(counter(i));
var sum = 0;
for (var round = 1; round <= 3; round++)
  for (var i = 0; i < N; i++) sum += counters[i](round);
function compose(f, g) { return function (x) { return f(g(x)); }; }
function inc(x) { return x + 1; }
var composed = 0;
for (var i = 1; i <= Math.floor(N / 100); i++) {
  var f = inc;
  for (var j = 0; j < 100; j++) f = compose(f, inc);
  composed += f(i);
}
function memo(fn) {
  var cache = {};
  return function (k) {
    var v = cache[k];
    if (v === undefined) { v = fn(k); cache[k] = v; }
    return v;
  };
}
var square = memo(function (k) { return [k * k, "sq" + k]; });
var squares = 0;
for (var i = 1; i <= N; i++) squares += square(i % 1000)[0] + square(i % 1000)[1].length;
print("closures", N, sum, composed, squares);
