#!/usr/bin/env python3
"""Builds the example support bundles from the real fixtures.

Usage: python3 examples/bundles/make.py ../shared/fixtures

The bundles are committed; this script records how they were made. Every raw
file is a real capture (see ../shared/fixtures/SOURCES.md) or is edited from
one in the way the named fault shows on a real node:

  h100-healthy       8x H100 SXM (DERIVED nvidia-smi XML from a real capture),
                     8x CX-7 NDR sysfs tree (gpud, verbatim), healthy NCCL run.
  h100-xid79-ecc     GPU4 (0000:9b:00.0) fell off the bus: Xid 79 in the kernel
                     log, gone from nvidia-smi, still on the PCI bus; GPU3 has
                     2 uncorrectable DRAM ECC errors with Xid 48 and 63.
  h100-ibdown-pcie   mlx5_4 port 1 is DOWN/Disabled; GPU2 (0000:4c:00.0) PCIe
                     link trained at x8 of x16.
"""
import json
import os
import re
import shutil
import sys

FIX = sys.argv[1] if len(sys.argv) > 1 else "../shared/fixtures"
OUT = os.path.dirname(os.path.abspath(__file__))
COLLECTED = "2026-11-28T02:00:00Z"
UPTIME = 2400000.00  # seconds; plain dmesg stamps below are near it
XML = os.path.join(FIX, "nvidia-smi/xml/DERIVED__h100x8_healthy__v12__drv535.161.08.xml")
IB = os.path.join(FIX, "infiniband/sys-class-infiniband-h100.0")
NCCL = os.path.join(FIX, "nccl/SYNTHETIC__h100x8_single-node_nvls_healthy_~480GBps.txt")

BUS = ["19", "3b", "4c", "5d", "9b", "bb", "cb", "db"]
IB_BUS = ["18", "2a", "3a", "5c", "9a", "ab", "ba", "da"]


def write(root, rel, data):
    p = os.path.join(root, rel)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        f.write(data)


def gpu_blocks(xml):
    """Splits the XML into head, list of <gpu> blocks, tail."""
    parts = re.split(r"(?=\t<gpu id=)", xml)
    head = parts[0]
    gpus = parts[1:]
    last = gpus[-1]
    i = last.index("</gpu>") + len("</gpu>\n")
    gpus[-1], tail = last[:i], last[i:]
    return head, gpus, tail


def nvlink_text(gpus_xml):
    out = []
    for i, g in enumerate(gpus_xml):
        name = re.search(r"<product_name>(.*?)</product_name>", g).group(1)
        uuid = re.search(r"<uuid>(.*?)</uuid>", g).group(1)
        out.append(f"GPU {i}: {name} (UUID: {uuid})")
        for l in range(18):
            out.append(f"\t Link {l}: 26.562 GB/s")
    for i, g in enumerate(gpus_xml):
        name = re.search(r"<product_name>(.*?)</product_name>", g).group(1)
        uuid = re.search(r"<uuid>(.*?)</uuid>", g).group(1)
        out.append(f"GPU {i}: {name} (UUID: {uuid})")
        for l in range(18):
            out.append(f"\t Link {l}: Replay Errors: 0")
            out.append(f"\t Link {l}: Recovery Errors: 0")
            out.append(f"\t Link {l}: CRC Errors: 0")
    return "\n".join(out) + "\n"


def pci_tree(root, width=None):
    width = width or {}
    for i, b in enumerate(BUS):
        d = f"fs/sys/bus/pci/devices/0000:{b}:00.0/"
        write(root, d + "vendor", "0x10de\n")
        write(root, d + "device", "0x2330\n")
        write(root, d + "class", "0x030200\n")
        write(root, d + "current_link_width", f"{width.get(i, 16)}\n")
        write(root, d + "max_link_width", "16\n")
        write(root, d + "current_link_speed", "32.0 GT/s PCIe\n")
        write(root, d + "max_link_speed", "32.0 GT/s PCIe\n")
        write(root, d + "driver", "nvidia\n")
    for b in IB_BUS:
        d = f"fs/sys/bus/pci/devices/0000:{b}:00.0/"
        write(root, d + "vendor", "0x15b3\n")
        write(root, d + "device", "0x1021\n")
        write(root, d + "class", "0x020700\n")
        write(root, d + "current_link_width", "16\n")
        write(root, d + "max_link_width", "16\n")
        write(root, d + "current_link_speed", "32.0 GT/s PCIe\n")
        write(root, d + "max_link_speed", "32.0 GT/s PCIe\n")
        write(root, d + "driver", "mlx5_core\n")


def common(root, xml, dmesg, sources=None):
    if os.path.exists(root):
        shutil.rmtree(root)
    os.makedirs(root)
    head, gpus, tail = gpu_blocks(xml)
    manifest = {
        "format": 1,
        "hostname": os.path.basename(root),
        "collected_at": COLLECTED,
        "fleetcheck_version": "example",
        "sources": sources or {},
    }
    write(root, "manifest.json", json.dumps(manifest, indent=2) + "\n")
    write(root, "nvidia-smi.xml", xml)
    write(root, "nvidia-smi-nvlink.txt", nvlink_text(gpus))
    write(root, "dmesg.txt", dmesg)
    shutil.copy(NCCL, os.path.join(root, "all_reduce_perf.txt"))
    write(root, "versions.json", json.dumps({
        "kernel": "5.15.0-105-generic",
        "fabric_manager": "535.161.08",
        "rdma_stack": "MLNX_OFED 23.10-1.1.9.0",
    }, indent=2) + "\n")
    write(root, "fs/proc/uptime", f"{UPTIME:.2f} 18345678.12\n")
    write(root, "fs/proc/modules",
          "nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)\n"
          "nvidia_uvm 1523712 4 - Live 0x0000000000000000 (OE)\n"
          "nvidia_drm 77824 0 - Live 0x0000000000000000 (OE)\n"
          "nvidia 56512512 97 nvidia_peermem,nvidia_uvm, Live 0x0000000000000000 (OE)\n"
          "mlx5_ib 450560 0 - Live 0x0000000000000000 (OE)\n"
          "mlx5_core 2289664 1 mlx5_ib, Live 0x0000000000000000 (OE)\n")
    write(root, "fs/proc/driver/nvidia/version",
          "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Thu Feb  8 00:36:56 UTC 2024\n"
          "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04) \n")
    shutil.copytree(IB, os.path.join(root, "fs/sys/class/infiniband"))
    # gpud set mlx5_1's link_downed to 255 for one of its tests (SOURCES.md);
    # a healthy node does not show that, so the examples carry 0.
    with open(os.path.join(root, "fs/sys/class/infiniband/mlx5_1/ports/1/counters/link_downed"), "w") as f:
        f.write("0")


CLEAN_DMESG = (
    "[    3.412345] nvidia: loading out-of-tree module taints kernel.\n"
    "[    4.100221] nvidia-nvlink: Nvlink Core is being initialized, major device number 508\n"
    "[    4.512300] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.161.08  Thu Feb  8 00:36:56 UTC 2024\n"
    "[   18.617069] mlx5_core 0000:18:00.0: 252.056 Gb/s available PCIe bandwidth\n"
    "[2399000.101010] systemd[1]: Started Daily apt upgrade and clean activities.\n"
)


def healthy():
    xml = open(XML).read()
    root = os.path.join(OUT, "h100-healthy")
    common(root, xml, CLEAN_DMESG)
    pci_tree(root)


def set_in_gpu(block, tag, value, within=None):
    if within:
        m = re.search(rf"<{within}>.*?</{within}>", block, re.S)
        inner = re.sub(rf"<{tag}>[^<]*</{tag}>", f"<{tag}>{value}</{tag}>", m.group(0))
        return block[:m.start()] + inner + block[m.end():]
    return re.sub(rf"<{tag}>[^<]*</{tag}>", f"<{tag}>{value}</{tag}>", block)


def xid79_ecc():
    xml = open(XML).read()
    head, gpus, tail = gpu_blocks(xml)
    g3 = gpus[3]
    g3 = set_in_gpu(g3, "dram_uncorrectable", "2", within="volatile")
    g3 = set_in_gpu(g3, "dram_uncorrectable", "2", within="aggregate")
    g3 = set_in_gpu(g3, "remapped_row_unc", "2")
    g3 = set_in_gpu(g3, "remapped_row_pending", "Yes")
    gpus[3] = g3
    del gpus[4]  # 0000:9b:00.0 fell off the bus: the driver no longer lists it
    head = head.replace("<attached_gpus>8</attached_gpus>", "<attached_gpus>7</attached_gpus>")
    xml = head + "".join(gpus) + tail
    dmesg = CLEAN_DMESG + (
        "[2397166.923949] NVRM: Xid (PCI:0000:5d:00): 48, pid=2503421, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n"
        "[2397166.983093] NVRM: Xid (PCI:0000:5d:00): 63, pid=2503421, name=python3, Row Remapping: New row (0x00000002eebc4100) Marked for Remapping, reset gpu to activate.\n"
        "[2398012.551200] NVRM: Xid (PCI:0000:9b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        "[2398012.551260] NVRM: GPU 0000:9b:00.0: GPU has fallen off the bus.\n"
    )
    root = os.path.join(OUT, "h100-xid79-ecc")
    # The NVLink text of a node that lost a GPU still comes from the 7 the driver sees.
    common(root, xml, dmesg)
    pci_tree(root)


def ibdown_pcie():
    xml = open(XML).read()
    head, gpus, tail = gpu_blocks(xml)
    gpus[2] = gpus[2].replace("<current_link_width>16x</current_link_width>", "<current_link_width>8x</current_link_width>")
    xml = head + "".join(gpus) + tail
    root = os.path.join(OUT, "h100-ibdown-pcie")
    common(root, xml, CLEAN_DMESG.replace("[2399000.101010]",
        "[2398500.000001] mlx5_core 0000:9a:00.0 ibp154s0: Link down\n[2399000.101010]"))
    pci_tree(root, width={2: 8})
    port = os.path.join(root, "fs/sys/class/infiniband/mlx5_4/ports/1")
    # Written without a trailing newline, like the rest of the fixture tree.
    for name, val in (("state", "1: DOWN"), ("phys_state", "3: Disabled"), ("rate", "10 Gb/sec (4X SDR)")):
        with open(os.path.join(port, name), "w") as f:
            f.write(val)


if __name__ == "__main__":
    healthy()
    xid79_ecc()
    ibdown_pcie()
    print("wrote", ", ".join(sorted(d for d in os.listdir(OUT) if os.path.isdir(os.path.join(OUT, d)))))
