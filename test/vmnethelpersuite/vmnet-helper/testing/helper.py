# SPDX-FileCopyrightText: The vmnet-helper authors
# SPDX-License-Identifier: Apache-2.0

import hashlib
import json
import logging
import os
import platform
import re
import socket
import uuid

from . import mac
from . import privileges
from . import process
from . import store

PREFIX = "/opt/vmnet-helper"
HELPER = os.path.join(PREFIX, "bin/vmnet-helper")
RUNNER = os.path.join(PREFIX, "bin/vmnet-run")
OPERATION_MODES = ["shared", "bridged", "host"]

# Apple recommends sizing the receive buffer at 4 times the size of the send
# buffer, and other projects typically use a 1 MiB send buffer and a 4 MiB
# receive buffer. However the send buffer size is not used to allocate a buffer
# in datagram sockets, it only limits the maximum packet size. We use 65 KiB
# buffer to allow the largest possible packet size (65550 bytes) when using the
# vmnet_enable_tso option.
SEND_BUFFER_SIZE = 65 * 1024

# The receive buffer size determines how many packets can be queued by the peer.
# Testing shows good performance with a 2 MiB receive buffer. We use a 4 MiB
# buffer to make ENOBUFS errors less likely for the peer.
RECV_BUFFER_SIZE = 4 * 1024 * 1024

# Scale buffer for higher offloading throughput (~2.5x). A larger factor would
# reduce ENOBUFS but adds latency from bufferbloat. With 8 MiB the buffer fills
# in ~2 ms, similar to ~2.6 ms without offloading.
RECV_BUFFER_SIZE_OFFLOAD = 8 * 1024 * 1024

# Vmnet interface info keys
# https://developer.apple.com/documentation/vmnet/interface_param_xpc_dictionary_keys?language=objc
VMNET_START_ADDRESS = "vmnet_start_address"
VMNET_END_ADDRESS = "vmnet_end_address"
VMNET_MAC_ADDRESS = "vmnet_mac_address"
VMNET_SUBNET_MASK = "vmnet_subnet_mask"
VMNET_INTERFACE_ID = "vmnet_interface_id"
VMNET_MAX_PACKET_SIZE = "vmnet_max_packet_size"

# Network info keys (--network mode only)
NET_IPV4_SUBNET = "net_ipv4_subnet"
NET_IPV4_MASK = "net_ipv4_mask"
NET_IPV6_PREFIX = "net_ipv6_prefix"
NET_IPV6_PREFIX_LEN = "net_ipv6_prefix_len"


class Helper:
    def __init__(
        self, args, fd=None, socket=None, logfile=None, generate_interface_id=True
    ):
        # Configuration
        self.fd = fd
        self.socket = socket
        self.vm_name = args.vm_name
        self.operation_mode = args.operation_mode
        self.start_address = args.start_address
        self.end_address = args.end_address
        self.subnet_mask = args.subnet_mask
        self.shared_interface = args.shared_interface
        self.network_name = args.network_name
        self.enable_isolation = args.enable_isolation
        self.enable_offloading = args.enable_offloading
        self.stats_interval = args.stats_interval
        self.verbose = args.verbose
        self.generate_interface_id = generate_interface_id

        # Running state.
        self.proc = None
        self.interface = None
        self.logfile = logfile

    def start(self):
        """
        Starts vmnet-helper with fd or socket.
        """
        if self.generate_interface_id and not self.network_name:
            interface_id = interface_id_from(self.vm_name)
            logging.info(
                "Starting vmnet-helper for '%s' with interface id '%s'",
                self.vm_name,
                interface_id,
            )
        else:
            interface_id = None
            logging.info(
                "Starting vmnet-helper for '%s'",
                self.vm_name,
            )
        cmd = self._build_command(interface_id)

        if self.logfile is None:
            vm_home = store.ensure_vm_dir(self.vm_name)
            self.logfile = os.path.join(vm_home, "vmnet-helper.log")

        uid, gid = privileges.creds()
        with open(self.logfile, "w") as log:
            if uid and gid:
                os.chown(self.logfile, uid, gid)
            self.proc = process.start(
                *cmd,
                stdout=process.PIPE,
                stderr=log,
                pass_fds=[self.fd] if self.fd is not None else [],
            )
        try:
            reply = self.proc.stdout.readline()  # type: ignore[attr-defined]
            if not reply:
                raise RuntimeError("No response from helper")

            self.interface = json.loads(reply)

            if self.network_name:
                self.interface[VMNET_MAC_ADDRESS] = mac.address_from(self.vm_name)

            logging.debug("interface: %s", self.interface)
        except:
            self.stop()
            raise

    def _build_command(self, interface_id):
        if requires_root():
            cmd = ["sudo", "--non-interactive"]
            if self.fd is not None:
                cmd.append(f"--close-from={self.fd + 1}")
        else:
            cmd = []

        cmd.append(HELPER)

        if self.fd is not None:
            cmd.append(f"--fd={self.fd}")
        elif self.socket is not None:
            cmd.append(f"--socket={self.socket}")
        else:
            raise ValueError("fd or socket required")

        if interface_id is not None:
            cmd.append(f"--interface-id={interface_id}")

        if self.network_name:
            cmd.append(f"--network={self.network_name}")

        if self.operation_mode:
            cmd.append(f"--operation-mode={self.operation_mode}")

        if self.start_address:
            cmd.append(f"--start-address={self.start_address}")

        if self.end_address:
            cmd.append(f"--end-address={self.end_address}")

        if self.subnet_mask:
            cmd.append(f"--subnet-mask={self.subnet_mask}")

        if self.enable_isolation:
            cmd.append("--enable-isolation")

        if self.shared_interface:
            cmd.append(f"--shared-interface={self.shared_interface}")

        if self.enable_offloading:
            cmd.extend(["--enable-tso", "--enable-checksum-offload"])

        if self.stats_interval:
            cmd.append(f"--stats-interval={self.stats_interval}")

        if self.verbose:
            cmd.append("--verbose")

        return cmd

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.proc = None


def requires_root():
    """
    Returns True if the helper requires root.
    """
    release = platform.mac_ver()[0]
    major = release.split(".")[0]
    return int(major) < 26


def interface_id_from(name):
    """
    Return unique UUID using the VM name. This UUID ensures that we get the
    same MAC address when running the same VM again.
    """
    full_name = f"vmnet-helper-example-{name}"
    md = hashlib.sha256(full_name.encode()).digest()
    return str(uuid.UUID(bytes=md[:16], version=4))


def socketpair(offloading=False):
    pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM, 0)

    recv_buffer_size = RECV_BUFFER_SIZE_OFFLOAD if offloading else RECV_BUFFER_SIZE

    for sock in pair:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_SIZE)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buffer_size)
        os.set_inheritable(sock.fileno(), True)
    return pair


def shared_interfaces():
    cp = process.run(
        "/opt/vmnet-helper/bin/vmnet-helper",
        "--list-shared-interfaces",
        stdout=process.PIPE,
    )
    return cp.stdout.decode().splitlines()
