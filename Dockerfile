# syntax=docker/dockerfile:1
#
# kube-userspace-proxy. Build with the repository root as context:
#   docker build -t kube-userspace-proxy:0.1.0 .
#
# Two stages: `build` installs every dependency with `npm ci`, compiles with `tsc` and bundles the
# output with rolldown (npm run build), then drops the dev dependencies; `runtime` is a slim Node 24
# (LTS) image with iptables, conntrack and iproute2 (the iptables and bind portals call them), the
# bundle and the production dependencies (the bundle leaves @kubernetes/client-node out, see
# rolldown.config.js), run as a non-root user.

# The major version is .node-version's (test/deploy.test.ts checks that they agree).
ARG NODE_IMAGE=node:24-bookworm-slim

FROM ${NODE_IMAGE} AS build
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json rolldown.config.js ./
COPY src ./src
RUN npm run build && npm prune --omit=dev --no-audit --no-fund

FROM ${NODE_IMAGE} AS runtime
# A non-root process keeps no capability across exec unless the file it runs carries it, and the
# DaemonSet grants NET_ADMIN only. So iptables (xtables-nft-multi behind iptables-restore) gets a
# file capability, and so does conntrack (the iptables portal deletes stale entries with it); setcap
# itself is removed again. NNP must stay off for it to apply
# (allowPrivilegeEscalation is left true in deploy/daemon-set.yaml). iproute2's `ip` drops file
# capabilities when not run by root: --portal bind needs runAsUser 0 (see the DaemonSet).
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables conntrack iproute2 libcap2-bin \
 && setcap cap_net_admin+ep /usr/sbin/xtables-nft-multi \
 && setcap cap_net_admin+ep /usr/sbin/conntrack \
 && apt-get purge -y libcap2-bin \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 proxy \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin proxy
WORKDIR /app
ENV NODE_ENV=production
# glibc: keep freed memory instead of returning it to the kernel at once. Node allocates a 64 KiB
# buffer per read of an accepted socket; without this, bulk transfers spend a good part of their
# cycles on page faults (bench/README.md has the figures).
ENV MALLOC_TRIM_THRESHOLD_=268435456 MALLOC_TOP_PAD_=16777216
# V8: a young generation of a fixed size, not one grown from the node's memory (src/core/heap-tuning.ts:
# V8_HEAP_FLAGS). Given here, the binary need not re-execute itself to add it.
ENV NODE_OPTIONS=--max-semi-space-size=16
COPY --from=build /src/package.json /src/package-lock.json ./
COPY --from=build /src/node_modules ./node_modules
COPY --from=build /src/dist/bundle ./dist/bundle
# The `proxy` user made above (65532, the conventional non-root uid); numeric, so runAsNonRoot can verify it.
USER 65532:65532
# package.json "bin". Flags and --config go in the DaemonSet's args.
ENTRYPOINT ["node", "dist/bundle/main.js"]
