#!/usr/bin/env bash
# Regenerates blobtool/_pb/blobtool_caffe_pb2.py and blobtool_onnx_pb2.py from proto/.
#
# protoc is pinned to grpcio-tools 1.49.1 (libprotoc 3.21.6) on purpose: newer
# protoc emits a runtime check that refuses any protobuf runtime older than
# itself, while 3.21 code imports on every runtime from 3.20 to 7.x (CI checks
# both ends). The tool runs in a throw-away virtual environment so that its own
# protobuf pin never touches the project's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
venv=${BLOBTOOL_PROTOC_VENV:-$(mktemp -d)/venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'grpcio-tools==1.49.1'
fi
for schema in blobtool_caffe blobtool_onnx; do
  "$venv/bin/python" -m grpc_tools.protoc -I"$here" --python_out="$root/blobtool/_pb" "$here/$schema.proto"
  echo "wrote blobtool/_pb/${schema}_pb2.py"
done
