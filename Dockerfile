# The controller image: `provisioning`, `nu` (the SSH providers run taskserv scripts with it),
# the taskserv catalog and a notice of everything they bundle, on a distroless-style root: only
# the shared libraries `provisioning` links, taken from Debian 12 (glibc, libgcc_s, the loader),
# the CA roots and passwd/group entries for uid 65532 — no shell, no package manager
# (scripts/image-rootfs.sh). Runs as uid 65532.
#
# Where a registry is reachable this builds unchanged with `docker build -t IMAGE .` (the
# builder stage compiles the binary and fetches nu; `--build-arg VERSION=… --build-arg
# REVISION=$(git rev-parse HEAD)` fill the OCI labels, `scripts/build-image.sh --registry`
# passes them). scripts/build-image.sh builds the same Dockerfile without any registry: it
# builds the binary and takes nu on the host, hands them in through PREBUILT, and imports a
# locally bootstrapped base under the base's name. Both paths work with the classic builder
# and with BuildKit.
ARG BASE=debian:12-slim
ARG BUILDER=rust:1-bookworm

FROM ${BUILDER} AS builder
# A directory in the build context holding `provisioning`, `nu`, `ca-certificates.crt` and
# `NOTICE` built or taken elsewhere; empty: build them here.
ARG PREBUILT=
# Pinned like scripts/setup.sh pins it.
ARG NUSHELL_VERSION=0.115.1
WORKDIR /src
COPY . .
RUN set -eu; \
    mkdir -p /out; \
    if [ -n "$PREBUILT" ]; then \
      cp "$PREBUILT/provisioning" "$PREBUILT/nu" "$PREBUILT/ca-certificates.crt" "$PREBUILT/NOTICE" /out/; \
    else \
      cargo build --locked --profile image -p provisioning-cli --bin provisioning; \
      cp target/image/provisioning /out/; \
      apt-get update; \
      apt-get install -y --no-install-recommends npm python3; \
      npm install --silent --prefix /tmp/nushell "nushell@${NUSHELL_VERSION}"; \
      cp "$(find /tmp/nushell/node_modules -type f -name nu -perm -u+x | head -n 1)" /out/nu; \
      strip /out/nu; \
      cp /etc/ssl/certs/ca-certificates.crt /out/; \
      python3 scripts/licences.py notice \
        --bundled "nushell ${NUSHELL_VERSION} MIT $(find /tmp/nushell/node_modules -name LICENSE -path '*nushell*' | head -n 1)" \
        > /out/NOTICE; \
    fi; \
    chmod 0755 /out/provisioning /out/nu; \
    chmod 0644 /out/ca-certificates.crt /out/NOTICE

# The root filesystem, assembled in the Debian base from its own copies of the libraries.
FROM ${BASE} AS rootfs
COPY --from=builder /out/ /in/
COPY scripts/image-rootfs.sh /usr/local/sbin/image-rootfs.sh
RUN sh /usr/local/sbin/image-rootfs.sh /in /rootfs

# Layers from the least to the most often changed, so an upgrade pulls little more than the
# binary: the root (libraries, CA roots, notice), nu, the catalog, `provisioning`.
FROM scratch
COPY --from=rootfs /rootfs/ /
# The Deployment mounts its `state` volume here; writable for a plain `docker run` too (owned
# by 65532 explicitly: builders differ in whether COPY --from keeps ownership).
COPY --from=rootfs --chown=65532:65532 /rootfs/var/lib/provisioning/ /var/lib/provisioning/
COPY --from=builder /out/nu /usr/local/bin/nu
COPY taskservs/catalog /usr/share/provisioning/catalog
# Cluster templates are found next to the catalog (`provisioning template list`).
COPY taskservs/templates /usr/share/provisioning/templates
COPY --from=builder /out/provisioning /usr/local/bin/provisioning
# Cloud APIs are HTTPS, verified against these roots.
ENV PATH=/usr/local/bin \
    PROVISIONING_CATALOG=/usr/share/provisioning/catalog \
    PROVISIONING_NU=/usr/local/bin/nu \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    HOME=/var/lib/provisioning
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="provisioning" \
      org.opencontainers.image.description="Provisioning controller: infrastructure as code the Kubernetes way" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
WORKDIR /var/lib/provisioning
ENTRYPOINT ["/usr/local/bin/provisioning"]
CMD ["controller"]
