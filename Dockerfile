# The controller image: `provisioning`, `nu` (the SSH providers run taskserv scripts with it)
# and the taskserv catalog on a small Debian base, running as uid 65532.
#
# Where a registry is reachable this builds unchanged with `docker build -t IMAGE .` (the
# builder stage compiles the binary and fetches nu). scripts/build-image.sh builds the same
# Dockerfile without any registry: it builds the binary and takes nu on the host, hands them in
# through PREBUILT, and imports a locally bootstrapped base under the base's name. Both paths
# work with the classic builder and with BuildKit.
ARG BASE=debian:12-slim
ARG BUILDER=rust:1-bookworm

FROM ${BUILDER} AS builder
# A directory in the build context holding `provisioning`, `nu` and `ca-certificates.crt`
# built or taken elsewhere; empty: build them here.
ARG PREBUILT=
# Pinned like scripts/setup.sh pins it.
ARG NUSHELL_VERSION=0.115.1
WORKDIR /src
COPY . .
RUN set -eu; \
    mkdir -p /out; \
    if [ -n "$PREBUILT" ]; then \
      cp "$PREBUILT/provisioning" "$PREBUILT/nu" "$PREBUILT/ca-certificates.crt" /out/; \
    else \
      cargo build --locked --profile image -p provisioning-cli --bin provisioning; \
      cp target/image/provisioning /out/; \
      apt-get update; \
      apt-get install -y --no-install-recommends npm; \
      npm install --silent --prefix /tmp/nushell "nushell@${NUSHELL_VERSION}"; \
      cp "$(find /tmp/nushell/node_modules -type f -name nu -perm -u+x | head -n 1)" /out/nu; \
      strip /out/nu; \
      cp /etc/ssl/certs/ca-certificates.crt /out/; \
    fi; \
    chmod 0755 /out/provisioning /out/nu; \
    chmod 0644 /out/ca-certificates.crt

FROM ${BASE}
COPY --from=builder /out/provisioning /out/nu /usr/local/bin/
# Cloud APIs are HTTPS, verified against the system roots (the slim base has none).
COPY --from=builder /out/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY taskservs/catalog /usr/share/provisioning/catalog
# Cluster templates are found next to the catalog (`provisioning template list`).
COPY taskservs/templates /usr/share/provisioning/templates
ENV PROVISIONING_CATALOG=/usr/share/provisioning/catalog \
    PROVISIONING_NU=/usr/local/bin/nu \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    HOME=/var/lib/provisioning
# The Deployment mounts its `state` volume here; a writable default for `docker run` too.
RUN mkdir -p /var/lib/provisioning && chown 65532:65532 /var/lib/provisioning
USER 65532:65532
WORKDIR /var/lib/provisioning
ENTRYPOINT ["provisioning"]
CMD ["controller"]
