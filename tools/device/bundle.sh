#!/usr/bin/env bash
# Packs built binaries with the shared libraries they load, so that they run
# on a machine that has a GPU driver but not the build's packages (gRPC,
# RocksDB, Gloo, liburing, ...): glibc, the driver (libcuda), NCCL and
# cuBLAS (180 and 700 MB; GPU hosts have them, e.g. in PyTorch's nvidia-nccl
# and nvidia-cublas packages, which `run` finds) are the target's own,
# everything else travels. Debug info is stripped.
#
#   tools/device/bundle.sh OUT_DIR BINARY...
#   OUT_DIR/run BINARY_NAME [ARGS...]     (on the target)
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 OUT_DIR BINARY..." >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out/bin" "$out/lib"
# The target's own: the C library, the GPU driver and NCCL.
system='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libcuda|libnvidia|libnccl|libcublas|libcublasLt)[.-]'
for binary in "$@"; do
  strip --strip-debug -o "$out/bin/$(basename "$binary")" "$binary"
  ldd "$binary" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $system ]] && continue
    [[ -e $out/lib/$name ]] || strip --strip-debug -o "$out/lib/$name" "$(readlink -f "$path")"
  done
done
cat >"$out/run" <<'RUN'
#!/usr/bin/env bash
here=$(cd "$(dirname "$0")" && pwd)
name=$1
shift
# Where the target keeps NCCL and cuBLAS outside the linker's cache: looked
# for once, then remembered beside the bundle.
found_dirs=$here/.nvidia-lib-dirs
if [[ ! -e $found_dirs ]]; then
  dirs=
  for lib in libnccl.so.2 libcublas.so.13 libcublasLt.so.13; do
    if ! ldconfig -p | grep -q "$lib"; then
      found=$(find / -xdev -name "$lib" -path '*nvidia*' 2>/dev/null | head -1)
      [[ -n $found ]] && dirs=$dirs:$(dirname "$found")
    fi
  done
  echo "$dirs" >"$found_dirs"
fi
libs=$here/lib$(cat "$found_dirs")
LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/$name" "$@"
RUN
chmod +x "$out/run"
du -sh "$out"
