#!/bin/sh
# Assembles the controller image's root filesystem (the Dockerfile's `rootfs` stage runs it in
# the Debian base as root): the CA roots and the notice from IN, plus only what IN's
# `provisioning` needs from the base — the shared libraries `ldd` names (glibc, libgcc_s,
# the loader), their Debian copyright files and dpkg records (so image scanners see glibc's
# version), passwd/group entries for uid 65532, nsswitch.conf, a /tmp. No shell, no package
# manager, no other files of the base: the final stage is `FROM scratch`.
#
#   image-rootfs.sh IN OUT
set -eu
IN=$1
OUT=$2
fail() { echo "image-rootfs: $*" >&2; exit 1; }
for f in provisioning nu ca-certificates.crt NOTICE; do
  [ -f "$IN/$f" ] || fail "$IN/$f missing"
done

# The binaries themselves are their own layers (the Dockerfile copies them).
mkdir -p "$OUT/usr/local/bin" "$OUT/etc/ssl/certs" "$OUT/usr/share/doc/provisioning" \
         "$OUT/var/lib/dpkg/status.d" "$OUT/var/lib/provisioning" "$OUT/tmp"
install -m 0644 "$IN/ca-certificates.crt" "$OUT/etc/ssl/certs/ca-certificates.crt"
install -m 0644 "$IN/NOTICE" "$OUT/usr/share/doc/provisioning/NOTICE"
chmod 1777 "$OUT/tmp"
# The state directory (the Dockerfile chowns it again: builders differ on COPY --from).
chown 65532:65532 "$OUT/var/lib/provisioning"

# `nu` must stay static: nothing below is copied for it.
# (ldd says "not a dynamic executable" or, for a static PIE, "statically linked".)
if ldd "$IN/nu" 2>&1 | grep -q '=>'; then
  fail "nu is dynamically linked; the image carries only what provisioning links"
fi

# Each library at the path the loader asks for (ldd's left or only column), dereferenced.
LIBS=$(ldd "$IN/provisioning" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
[ -n "$LIBS" ] || fail "ldd names no library for provisioning"
PACKAGES=
for lib in $LIBS; do
  mkdir -p "$OUT$(dirname "$lib")"
  cp -L "$lib" "$OUT$lib"
  pkg=$(dpkg -S "$lib" 2>/dev/null | head -n 1 | cut -d: -f1) || true
  [ -n "$pkg" ] || pkg=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null | head -n 1 | cut -d: -f1) || true
  [ -n "$pkg" ] || fail "no Debian package owns $lib"
  case " $PACKAGES " in *" $pkg "*) ;; *) PACKAGES="$PACKAGES $pkg" ;; esac
done

# Their licences and versions, as distroless images record them.
{
  echo
  echo "=== Shared libraries from Debian ($(. /etc/os-release && echo "$PRETTY_NAME")) ==="
  echo
} >> "$OUT/usr/share/doc/provisioning/NOTICE"
for pkg in $PACKAGES; do
  copyright=/usr/share/doc/$pkg/copyright
  [ -f "$copyright" ] || fail "$copyright missing in the base (a base without copyright files cannot ship its libraries)"
  mkdir -p "$OUT/usr/share/doc/$pkg"
  cp "$copyright" "$OUT/usr/share/doc/$pkg/copyright"
  dpkg-query -s "$pkg" > "$OUT/var/lib/dpkg/status.d/$pkg"
  dpkg-query -W -f '${Package} ${Version} (source ${source:Package}): licence in /usr/share/doc/${Package}/copyright\n' "$pkg" \
    >> "$OUT/usr/share/doc/provisioning/NOTICE"
done

cat > "$OUT/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:provisioning controller:/var/lib/provisioning:/sbin/nologin
EOF
cat > "$OUT/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
# glibc >= 2.34 carries the `files` and `dns` services itself: no libnss_* to copy.
cat > "$OUT/etc/nsswitch.conf" <<'EOF'
passwd: files
group: files
hosts: files dns
EOF
cp /etc/os-release "$OUT/etc/os-release" 2>/dev/null || cp /usr/lib/os-release "$OUT/etc/os-release"
