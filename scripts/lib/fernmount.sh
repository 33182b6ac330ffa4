# Shared by the scripts that test a real fernfs mount: builds fernfs, makes a temporary image,
# mounts it, and always unmounts and removes it on exit. Source it, then call fern_setup
# [MOUNT_OPTIONS]; it sets $fernfs, $work, $mnt, $img.
# FERN_ETCD=N (N members, e.g. 3): the file system lives on a private etcd cluster started by
# scripts/etcd-cluster in $work instead of an image file; $img is then its etcd:// URL, and
# the mount gets the etcd defaults (docs/distributed.md §7).
# Skips (exit 0 with a SKIPPED line) when the machine cannot mount FUSE, unless FERN_REQUIRE_FUSE=1.

fern_skip_or_fail() {
  if [ "${FERN_REQUIRE_FUSE:-0}" = 1 ]; then
    echo "FAILED: $1" >&2
    exit 1
  fi
  echo "SKIPPED: $1" >&2
  exit 0
}

fern_setup() {
  [ -e /dev/fuse ] || fern_skip_or_fail "/dev/fuse is absent"
  if [ "$(id -u)" != 0 ] && ! command -v fusermount3 >/dev/null; then
    fern_skip_or_fail "not root and no fusermount3 (apt-get install fuse3)"
  fi
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  echo "== building fernfs (release)" >&2
  (cd "$root" && cargo build --release -q -p fernfs)
  fernfs="${CARGO_TARGET_DIR:-$root/target}/release/fernfs"
  work=$(mktemp -d "${TMPDIR:-/tmp}/fernfs-test.XXXXXX")
  chmod 0755 "$work" # other users (pjdfstest's dummy users) must reach the mount
  mnt="$work/mnt"
  img="$work/fernfs.img"
  mkdir -p "$mnt"
  trap fern_teardown EXIT
  trap 'exit 130' INT TERM
  if [ -n "${FERN_ETCD:-}" ]; then
    local endpoints
    endpoints=$("$root/scripts/etcd-cluster" start "$work/etcd" "$FERN_ETCD")
    fern_etcd_dir="$work/etcd"
    fern_etcd_script="$root/scripts/etcd-cluster"
    img="etcd://$endpoints/fernfs-test"
    echo "== file system on etcd: $img" >&2
  fi
  "$fernfs" mkfs "$img" 2>/dev/null
  if [ -n "${1:-}" ]; then
    "$fernfs" mount "$img" "$mnt" -o "$1"
  else
    "$fernfs" mount "$img" "$mnt"
  fi
  fern_mounted=1
  fern_check_transport "${1:-}"
}

# The mount must use the transport its options select, or a silent fallback would test the
# wrong one: transport=uring (or enable_uring) the rings; transport=dev /dev/fuse; neither
# (the default, auto) the rings when the kernel's enable_uring is on, else /dev/fuse. (Root
# switches the rings on with `echo 1 > /sys/module/fuse/parameters/enable_uring`, or a mount
# with -o enable_uring does; .ci/run does the former.)
fern_check_transport() {
  local want=dev line
  case ",$1," in
    *,transport=dev,*) want=dev ;;
    *,transport=uring,* | *,enable_uring,*) want=uring ;;
    *) case "$(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null)" in Y | 1) want=uring ;; esac ;;
  esac
  line=$("$fernfs" stat "$mnt" | grep '^FUSE transport:' || true)
  echo "== $line" >&2
  case "$line" in
    "FUSE transport:     $want "*) ;;
    *) fern_skip_or_fail "the mount should use transport $want (options: ${1:-none}), but: $line" ;;
  esac
}

# Unmounts (waiting for the daemon to close the image) and checks the image with fsck.
fern_unmount_and_fsck() {
  "$fernfs" umount "$mnt"
  fern_mounted=0
  "$fernfs" fsck "$img"
}

fern_teardown() {
  local rc=$?
  cd /
  if [ "${fern_mounted:-0}" = 1 ]; then
    "$fernfs" umount "$mnt" 2>/dev/null || "$fernfs" umount --lazy "$mnt" 2>/dev/null \
      || fusermount3 -u -z "$mnt" 2>/dev/null || true
  fi
  if [ -n "${fern_etcd_dir:-}" ]; then
    "$fern_etcd_script" stop "$fern_etcd_dir" >/dev/null 2>&1 || true
  fi
  if [ "${FERN_KEEP:-0}" = 1 ]; then
    echo "kept $work (FERN_KEEP=1)" >&2
  else
    rm -rf "$work"
  fi
  exit $rc
}
