# bench/programs/text.pl - Perl hashes, strings and regular expressions, run by bench/programs.py.
#
# Usage: perl text.pl SCALE. The shape of a log-processing job: lines of a web server's access log
# are made, split by a regular expression, counted in hashes of hashes and arrays, rewritten with
# substitutions, joined into a report string that grows, and the hashes thinned and refilled round
# after round. Deterministic (keys are sorted before anything is printed or summed): prints the
# line and key counts and an MD5 of the reports, the same under every allocator.
use strict;
use warnings;
use Digest::MD5;

my $scale = $ARGV[0] // 1;
my $count = int(18000 * $scale) || 1;
my @verbs = qw(GET POST PUT DELETE HEAD);
my @agents = ("curl/7.88", "Mozilla/5.0 (X11; Linux x86_64)", "python-requests/2.28", "Wget/1.21");
my $md5 = Digest::MD5->new;
my (%by_path, %by_client, @slow);
my $lines = 0;

for my $round (0 .. 4) {
    my @log;
    for my $i (0 .. $count - 1) {
        my $n = $i * 7919 + $round * 104729;
        my $ip = join ".", 10, $n % 251, ($n >> 3) % 253, ($n >> 7) % 255;
        my $path = "/" . join("/", map { "seg" . (($n >> $_) % 17) } 0 .. $i % 5) . "?id=" . ($n % 10007);
        push @log, sprintf('%s - - [%02d/Dec/2026:%02d:%02d:%02d] "%s %s HTTP/1.1" %d %d "%s"',
                           $ip, 1 + $i % 28, $i % 24, $i % 60, $n % 60, $verbs[$n % 5], $path,
                           (200, 200, 304, 404, 500)[$n % 5], $n % 50000, $agents[$n % 4]);
    }
    for my $line (@log) {
        next unless $line =~ m{^(\S+) \S+ \S+ \[([^\]]+)\] "(\w+) ([^"?]+)(?:\?(\S*))? [^"]*" (\d+) (\d+) "([^"]*)"};
        my ($ip, $when, $verb, $path, $query, $status, $bytes, $agent) = ($1, $2, $3, $4, $5, $6, $7, $8);
        $lines++;
        $by_path{$path}{$verb}++;
        $by_path{$path}{bytes} += $bytes;
        push @{ $by_client{$ip} }, "$status:$bytes";
        push @slow, "$when $path" if $bytes > 49000;
        (my $short = $agent) =~ s/\s*\(.*?\)//g;
        $by_client{"agent $short"} //= [];
    }
    my $report = "";
    for my $path (sort keys %by_path) {
        my $h = $by_path{$path};
        $report .= "$path " . join(",", map { "$_=$h->{$_}" } sort keys %$h) . "\n";
    }
    for my $ip (sort keys %by_client) {
        my $list = $by_client{$ip};
        (my $text = join(" ", @$list)) =~ s/(\d+):(\d+)/$1 x $2/g;
        $report .= "$ip " . scalar(@$list) . " " . length($text) . "\n";
    }
    $report =~ s/seg(\d+)/S$1/g;
    $md5->add($report);
    for my $ip (sort keys %by_client) {
        delete $by_client{$ip} if length($ip) % 3 == $round % 3;
    }
    @slow = grep { !/seg1\b/ } @slow;
}
printf "%d %d %d %d %s\n", $lines, scalar(keys %by_path), scalar(keys %by_client), scalar(@slow), $md5->hexdigest;
