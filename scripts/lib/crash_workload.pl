#!/usr/bin/perl
# Crash-test workload for scripts/crash-mount.
#   write DIR ACKLOG TAG : forever, create DIR/TAG-N (a few KiB, content derived from the
#                          name), fsync it, and only then append its name to ACKLOG (on
#                          another file system) and fsync the log. Every 7th file also renames
#                          an acknowledged file, and every 11th deletes one, after fsyncs.
#   verify DIR ACKLOG    : every name still in ACKLOG exists under DIR with its content.
use strict;
use warnings;
use IO::Handle;
use Fcntl qw(O_WRONLY O_CREAT O_TRUNC O_RDONLY O_APPEND);

sub content { my ($name) = @_; my $n = 1 + (unpack("%32C*", $name) % 24); return ("$name\n" x (40 * $n)); }

my ($mode, $dir, $ack, $tag) = @ARGV;
die "usage: crash_workload.pl write|verify DIR ACKLOG [TAG]\n" unless defined $ack;

if ($mode eq 'write') {
    mkdir "$dir" unless -d $dir;
    open(my $log, '>>', $ack) or die "ack log: $!\n";
    $log->autoflush(1);
    opendir(my $dh, $dir) or die "opendir $dir: $!\n";
    my @acked;
    for (my $i = 0; ; $i++) {
        my $name = "$tag-$i";
        sysopen(my $fh, "$dir/$name", O_WRONLY | O_CREAT | O_TRUNC, 0644) or die "create: $!\n";
        my $c = content($name);
        syswrite($fh, $c) == length($c) or die "write: $!\n";
        $fh->sync or die "fsync: $!\n";
        close($fh);
        print $log "+$name\n"; $log->sync;
        push @acked, $name;
        if ($i % 7 == 6 && @acked > 2) {
            # rename an acknowledged file to a new name (content is derived from the old name)
            my $old = splice(@acked, int(rand(@acked - 1)), 1);
            # Intent first: if the daemon dies mid-rename, either name is a correct outcome.
            print $log "~$old>$old.moved\n"; $log->sync;
            rename("$dir/$old", "$dir/$old.moved") or die "rename: $!\n";
            sysopen(my $d, $dir, O_RDONLY) or die "open dir: $!\n";
            $d->sync or die "fsync dir: $!\n"; close($d);
            print $log "-$old\n+$old.moved=$old\n"; $log->sync;
        }
        if ($i % 11 == 10 && @acked > 2) {
            my $old = splice(@acked, 0, 1);
            print $log "~$old>\n"; $log->sync;   # in flight: present or absent are both fine
            unlink("$dir/$old") or die "unlink: $!\n";
            sysopen(my $d, $dir, O_RDONLY) or die "open dir: $!\n";
            $d->sync or die "fsync dir: $!\n"; close($d);
            print $log "-$old\n"; $log->sync;
        }
    }
} elsif ($mode eq 'verify') {
    open(my $log, '<', $ack) or die "ack log: $!\n";
    my (%want, %pending);
    while (my $l = <$log>) {
        next unless $l =~ /\n$/;      # a torn last line is not an acknowledgement
        chomp $l;
        next unless length $l > 1;
        my ($op, $rest) = (substr($l, 0, 1), substr($l, 1));
        if ($op eq '+') { my ($n, $src) = split(/=/, $rest, 2); $want{$n} = $src // $n; }
        elsif ($op eq '-') { delete $want{$rest}; delete $pending{$rest}; }
        elsif ($op eq '~') { my ($from, $to) = split(/>/, $rest, 2); $pending{$from} = $to // ''; }
    }
    my ($ok, $bad) = (0, 0);
    for my $n (sort keys %want) {
        my $expect = content($want{$n});
        if (exists $pending{$n}) {
            # An operation on $n was in flight at the crash (intent logged, never confirmed):
            # the file may be under its old name, its new name, or (unlink) gone.
            my $to = $pending{$n};
            my $found = 0;
            for my $cand ($n, length $to ? ($to) : ()) {
                if (open(my $fh, '<', "$dir/$cand")) {
                    local $/; my $got = <$fh>;
                    $found = 1 if defined $got && $got eq $expect;
                }
            }
            if ($found || !length $to) { $ok++; next; }
            print STDERR "verify: $n (rename to $to in flight): under neither name\n";
            $bad++;
            next;
        }
        if (open(my $fh, '<', "$dir/$n")) {
            local $/; my $got = <$fh>;
            if (defined $got && $got eq $expect) { $ok++; next; }
            print STDERR "verify: $n: wrong content\n";
        } else {
            print STDERR "verify: $n: $!\n";
        }
        $bad++;
    }
    print "$ok $bad\n";
    exit($bad ? 1 : 0);
} else {
    die "unknown mode $mode\n";
}
