// trees.js - recursion: binary trees built and walked recursively (a long-lived one of depth 7 + log2 N, then N
// short-lived ones of depth 4 to 10), and a recursive descent over a nested list of lists.
// The host sets N and print (tests/engine.h); trees.lua and trees.rb do the same in their languages.
function make(depth) {
  if (depth === 0) return [];
  return [make(depth - 1), make(depth - 1)];
}
function count(tree) {
  if (tree.length === 0) return 1;
  return 1 + count(tree[0]) + count(tree[1]);
}
function nest(depth, width) {
  var list = [depth];
  if (depth > 0) for (var i = 0; i < width; i++) list.push(nest(depth - 1, width));
  return list;
}
function total(list) {
  var sum = list[0];
  for (var i = 1; i < list.length; i++) sum += total(list[i]);
  return sum;
}
var deep = 7 + Math.floor(Math.log(N) / Math.LN2);
var long = make(deep);
var nodes = 0;
for (var i = 1; i <= N; i++) nodes += count(make(4 + i % 7));
print("trees", N, count(long), nodes, total(nest(deep - 8, 5)));
