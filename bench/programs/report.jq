# bench/programs/report.jq - jq over generated JSON, run by bench/programs.py.
#
# Usage: jq -c -f report.jq events.json, where events.json is the array of events bench/programs.py
# writes. The shape of a log or API-dump report: events grouped by country with sums, the top ones
# sorted, the tags counted, and a third of the events rewritten with string interpolation into new
# objects serialised with tojson; every step makes and drops many small JSON values. Deterministic:
# prints one line of counts and sums, the same under every allocator.
def total: map(.amount) | add;
{
  events: length,
  countries: (group_by(.user.country) | map({country: .[0].user.country, n: length, total: total})),
  top: (sort_by(-.amount, .id) | .[:10] | map(.id)),
  tags: ([.[].tags[]] | group_by(.) | map([.[0], length])),
  rewritten: (map(select(.id % 3 == 0) | {id, who: "\(.user.name) <\(.user.email)>", tags: (.tags | join(",")),
                                          lines: [.items[] | "\(.sku) x\(.qty)"]})
              | tojson | length),
  items: ([.[].items[] | .qty * .price] | add)
}
