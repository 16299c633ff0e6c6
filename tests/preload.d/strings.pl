# strings.pl - a Perl workload for tests/preload: hashes, strings, regexes, sort, and interpreter
# threads (each one a copy of the interpreter) handing data through a queue. The output depends only
# on what was computed: hash keys are sorted before anything is printed.
use strict;
use warnings;
use threads;
use Thread::Queue;
use Digest::MD5 qw(md5_hex);

# A deterministic generator of our own (rand with srand is not guaranteed the same across perl
# builds).
my $state = 12345;
sub next_random { $state = ($state * 1103515245 + 12345) % 2147483648; return $state; }

# Hashes: 200k keys built, changed, half deleted. (Each section is a block: its data is freed at its
# end, and the threads at the end do not copy it.)
{
    my %h;
    for my $i (1 .. 200_000) {
        $h{"key$i"} = sprintf("%08x-%s", next_random(), "v" x ($i % 37));
    }
    for my $i (1 .. 200_000) {
        next unless $i % 3 == 0;
        $h{"key$i"} .= "+" . ($i * 7);
    }
    delete $h{"key$_"} for grep { $_ % 2 } 1 .. 200_000;
    my $ctx = Digest::MD5->new;
    $ctx->add($_, $h{$_}) for sort keys %h;
    printf "hash: %d keys, %s\n", scalar(keys %h), $ctx->hexdigest;
}

# Strings: a string grown piece by piece past several MB, regex substitutions over it, split and join.
{
    my $s = "";
    $s .= "line " . next_random() . " of text\n" for 1 .. 150_000;
    my $copy = $s;
    (my $subst = $copy) =~ s/(\d+)/<$1>/g;
    my $count = () = $subst =~ /<\d*7>/g;
    my @lines = split /\n/, $subst;
    my $joined = join "|", reverse @lines;
    $copy =~ tr/a-z/A-Z/;
    printf "strings: %d bytes, %d after s///, %d matches, %d lines, %s %s\n",
        length($s), length($subst), $count, scalar(@lines), md5_hex($joined), md5_hex($copy);
}

# Big repeated strings, substr edits, and freeing them.
{
    my @big = map { ("x" x (1_000_000 + $_ * 300_000)) . $_ } 0 .. 9;
    substr($big[$_], 1000, 10, "edit$_") for 0 .. 9;
    my $total = 0;
    $total += length for @big;
    my $big_digest = md5_hex(join "", map { substr($_, 990, 30) } @big);
    @big = ();
    print "big: $total $big_digest\n";
}

# Sort: numbers, strings, a custom comparison; arrays of arrays.
{
    my @nums = map { next_random() % 1_000_000 } 1 .. 200_000;
    my @sorted = sort { $a <=> $b } @nums;
    my @words = map { sprintf("w%05d", $_ % 50_000) } @nums;
    my @by_word = sort { $b cmp $a } @words;
    my @rows = map { [$_ % 100, $_, "r$_"] } @nums[0 .. 49_999];
    my @by_row = sort { $a->[0] <=> $b->[0] or $a->[2] cmp $b->[2] } @rows;
    printf "sort: %d..%d, %s..%s, %s\n", $sorted[0], $sorted[-1], $by_word[0], $by_word[-1],
        md5_hex(join ",", map { $_->[2] } @by_row[0 .. 999]);
}

# Threads: four workers take strings from one queue, build hashes and regex results, and return digests;
# what they return is freed by the main thread.
my $work = Thread::Queue->new;
my $done = Thread::Queue->new;
my @workers = map {
    threads->create(sub {
        my %seen;
        while (defined(my $item = $work->dequeue)) {
            my ($n, $text) = @$item;
            my %words;
            $words{$_}++ for $text =~ /(\w+)/g;
            my $top = join ",", map { "$_=$words{$_}" } (sort { $words{$b} <=> $words{$a} or $a cmp $b } keys %words)[0 .. 2];
            $seen{$n} = md5_hex($top . length $text);
            $done->enqueue([$n, $top]);
        }
        return join ";", map { "$_:$seen{$_}" } sort { $a <=> $b } keys %seen;
    });
} 1 .. 4;
for my $n (1 .. 400) {
    my $text = join " ", map { "w" . (next_random() % (50 + $n % 30)) } 1 .. 300 + $n * 5;
    $work->enqueue([$n, $text]);
}
$work->end;
my %results;
my @from_workers = map { $_->join } @workers;
while (defined(my $r = $done->dequeue_nb)) {
    $results{$r->[0]} = $r->[1];
}
my %all = map { split /:/ } map { split /;/ } @from_workers;
printf "threads: %d results, %d digests, %s %s\n", scalar(keys %results), scalar(keys %all),
    md5_hex(join "\n", map { "$_ $results{$_}" } sort { $a <=> $b } keys %results),
    md5_hex(join "\n", map { "$_ $all{$_}" } sort { $a <=> $b } keys %all);
