#!/bin/sh
# ftplane's EFA check: fail loudly when a pod asked for EFA but NCCL would fall back to TCP sockets
# (which it does without a word at NCCL_DEBUG=WARN), then run the command, if one is given.
#
# Installed in the trainer image as /opt/ftplane/bin/efa-check, the image's entrypoint; the
# kubernetes backend also runs it as the init container `efa-check` of every pod that requests
# vpc.amazonaws.com/efa, with the trainer's NCCL and libfabric variables (FTPLANE_EFA_EXPECTED=1).
#
# What it proves is what NCCL itself would load. NCCL opens one network plugin by name: with
# NCCL_NET_PLUGIN unset, libnccl-net.so; set to a name, libnccl-net-<name>.so; set to a path, that file
# (NCCL's plugin loader, src/plugin/plugin_open.cc), through the dynamic linker: LD_LIBRARY_PATH first,
# then the linker cache. NGC's PyTorch images carry plugins of their own on those paths (HPC-X's
# SHARP plugin is a libnccl-net.so), so the check resolves the name as NCCL would and requires the file
# found to be the aws-ofi-nccl plugin, loadable, linked to libfabric, with libfabric seeing the EFA
# provider. Exit status, read by the Job's podFailurePolicy and by ftplane
# (workers/backends/kubernetes/policy.py):
#   94  this node cannot do EFA (no EFA device in the container, or libfabric finds no EFA
#       provider): the node is blamed and the job restarts without it
#   78  the image cannot do EFA (NCCL would load no plugin, another plugin than aws-ofi-nccl, or one
#       that cannot be loaded): the job fails
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

# The file the dynamic linker gives NCCL for the plugin it would open.
nccl_net_plugin() {
    name="${NCCL_NET_PLUGIN:-}"
    case "$name" in
        "") want="libnccl-net.so" ;;
        /*) [ -e "$root$name" ] && echo "$root$name"; return ;;
        *) want="libnccl-net-$name.so" ;;
    esac
    old_ifs="$IFS"
    IFS=:
    for dir in ${LD_LIBRARY_PATH:-}; do
        if [ -n "$dir" ] && [ -e "$root$dir/$want" ]; then IFS="$old_ifs"; echo "$root$dir/$want"; return; fi
    done
    IFS="$old_ifs"
    ldconfig -p 2>/dev/null | awk -v want="$want" '$1 == want { print $NF; exit }'
}

devices=0
for dev in "$root"/dev/infiniband/uverbs*; do
    [ -e "$dev" ] && devices=$((devices + 1))
done

if [ "${FTPLANE_EFA_EXPECTED:-0}" = "1" ] || [ "$devices" -gt 0 ]; then
    [ "$devices" -gt 0 ] || fail 94 "EFA was requested but no EFA device (/dev/infiniband/uverbs*) is in the container: the node's EFA device plugin gave none"
    plugin=$(nccl_net_plugin)
    asked="${NCCL_NET_PLUGIN:-unset}"
    [ -n "$plugin" ] || fail 78 "NCCL would load no network plugin (NCCL_NET_PLUGIN=$asked: not on LD_LIBRARY_PATH nor in the linker cache), so it would use TCP sockets: build the image with INSTALL_EFA=1 (the aws-ofi-nccl plugin)"
    real=$(readlink -f "$plugin" 2>/dev/null || echo "$plugin")
    case "$real" in
        */ofi-nccl/*|*aws-ofi-nccl*) ;;
        *) fail 78 "NCCL would load $plugin (NCCL_NET_PLUGIN=$asked), not the aws-ofi-nccl plugin, so it would not use EFA: remove that plugin from the image or set NCCL_NET_PLUGIN=ofi" ;;
    esac
    linked=$(ldd "$plugin" 2>&1)
    missing=$(echo "$linked" | grep "not found" | sed 's/^[[:space:]]*//' | paste -sd ';' -)
    [ -z "$missing" ] || fail 78 "the aws-ofi-nccl plugin $plugin cannot be loaded (missing: $missing): NCCL would use TCP sockets"
    echo "$linked" | grep -q "libfabric" || fail 78 "the plugin $plugin NCCL would load is not linked to libfabric: it cannot use EFA"
    fi_info -p efa -t FI_EP_RDM >/dev/null 2>&1 || fail 94 "libfabric finds no EFA provider (fi_info -p efa) with $devices EFA device(s): this node's EFA driver or devices do not work"
    echo "ftplane-efa-check: EFA ready ($devices devices, NCCL loads $plugin)"
fi

if [ "$#" -gt 0 ]; then
    exec "$@"
fi
