#!/bin/sh
# ftplane's EFA check: fail loudly when a pod asked for EFA but NCCL would fall back to TCP sockets
# (which it does without a word at NCCL_DEBUG=WARN), then run the command, if one is given.
#
# Installed in the trainer image as /opt/ftplane/bin/efa-check, the image's entrypoint; the
# kubernetes backend also runs it as the init container `efa-check` of every pod that requests
# vpc.amazonaws.com/efa (it sets FTPLANE_EFA_EXPECTED=1). Exit status, read by the Job's
# podFailurePolicy and by ftplane (workers/backends/kubernetes/policy.py):
#   94  this node cannot do EFA (no EFA device in the container, or libfabric finds no EFA
#       provider): the node is blamed and the job restarts without it
#   78  the image cannot do EFA (no aws-ofi-nccl plugin, or one that cannot be loaded): the job fails
# Without FTPLANE_EFA_EXPECTED=1 and with no EFA device, it checks nothing.
# FTPLANE_EFA_ROOT prefixes every path it looks at (tests).
set -u
root="${FTPLANE_EFA_ROOT:-}"

fail() {
    code="$1"
    shift
    echo "ftplane-efa-check: $*" >&2
    if [ -w /dev/termination-log ]; then echo "$*" > /dev/termination-log; fi
    exit "$code"
}

devices=0
for dev in "$root"/dev/infiniband/uverbs*; do
    [ -e "$dev" ] && devices=$((devices + 1))
done

if [ "${FTPLANE_EFA_EXPECTED:-0}" = "1" ] || [ "$devices" -gt 0 ]; then
    [ "$devices" -gt 0 ] || fail 94 "EFA was requested but no EFA device (/dev/infiniband/uverbs*) is in the container: the node's EFA device plugin gave none"
    plugin=""
    for candidate in "$root"/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so "$root"/opt/amazon/ofi-nccl/lib/libnccl-net.so "$root"/opt/aws-ofi-nccl/lib/libnccl-net.so; do
        if [ -e "$candidate" ]; then plugin="$candidate"; break; fi
    done
    [ -n "$plugin" ] || fail 78 "the aws-ofi-nccl plugin (libnccl-net*.so) is not in the image, so NCCL would use TCP sockets: build the image with INSTALL_EFA=1"
    missing=$(ldd "$plugin" 2>&1 | grep "not found" | sed 's/^[[:space:]]*//' | paste -sd ';' -)
    [ -z "$missing" ] || fail 78 "the aws-ofi-nccl plugin $plugin cannot be loaded (missing: $missing): NCCL would use TCP sockets"
    fi_info -p efa -t FI_EP_RDM >/dev/null 2>&1 || fail 94 "libfabric finds no EFA provider (fi_info -p efa) with $devices EFA device(s): this node's EFA driver or devices do not work"
    echo "ftplane-efa-check: EFA ready ($devices devices, $plugin)"
fi

if [ "$#" -gt 0 ]; then
    exec "$@"
fi
