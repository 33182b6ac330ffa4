#!/usr/bin/perl
# TokuBench-like F1 (quick): create FILES files of SIZE bytes under DIR, at most PER_DIR per
# directory, then sync(1). Prints "files seconds files_per_second" on stdout.
# Usage: f1.pl DIR [FILES [SIZE [PER_DIR]]]
use strict;
use warnings;
use Fcntl qw(O_WRONLY O_CREAT O_EXCL);
use IO::Handle;
use POSIX ();
use Time::HiRes qw(time);

my ($dir, $files, $size, $per) = @ARGV;
die "usage: f1.pl DIR [FILES [SIZE [PER_DIR]]]\n" unless defined $dir;
$files //= 20000;
$size  //= 200;
$per   //= 128;
my $data = join('', map { chr(32 + ($_ * 7) % 95) } 0 .. $size - 1);

mkdir $dir or die "mkdir $dir: $!\n" unless -d $dir;
my $t0 = time;
for my $i (0 .. $files - 1) {
    my $d = sprintf("%s/d%05d", $dir, int($i / $per));
    if ($i % $per == 0) { mkdir $d or die "mkdir $d: $!\n"; }
    my $f = sprintf("%s/f%07d", $d, $i);
    # POSIX::open, not sysopen: a PerlIO handle probes isatty() with an ioctl, which on FUSE
    # is one more round trip per file that no C program would make.
    my $fd = POSIX::open($f, O_WRONLY | O_CREAT | O_EXCL, 0644);
    die "create $f: $!\n" unless defined $fd;
    my $n = POSIX::write($fd, $data, $size);
    die "write $f: $!\n" unless defined $n && $n == $size;
    POSIX::close($fd) // die "close $f: $!\n";
}
system('sync') == 0 or die "sync failed\n";
# sync(1) asks every file system to flush, but FUSE file systems may not receive it; an fsync
# of one file makes a fernfs store (one ordered log) durable as a whole.
my $last = sprintf("%s/d%05d/f%07d", $dir, int(($files - 1) / $per), $files - 1);
open(my $lf, '<', $last) or die "open $last: $!\n";
$lf->sync or die "fsync $last: $!\n";
close($lf);
my $dt = time - $t0;
printf "%d %.3f %.0f\n", $files, $dt, $files / $dt;
