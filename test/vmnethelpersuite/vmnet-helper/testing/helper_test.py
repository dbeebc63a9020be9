# SPDX-FileCopyrightText: The vmnet-helper authors
# SPDX-License-Identifier: Apache-2.0

# pyright: basic, reportOperatorIssue=false, reportOptionalSubscript=false
# pyright: reportOptionalMemberAccess=false

"""
Tests for vmnet-helper using scapy for network verification.

These tests start vmnet-helper and use scapy to verify network connectivity
without requiring a virtual machine. This makes tests fast and suitable for CI
on any macOS version and architecture.

Requirements:
- vmnet-helper installed at /opt/vmnet-helper
- scapy package installed
- sudo configured for passwordless vmnet-helper (macOS < 26)
"""

import contextlib
import ipaddress
import logging
import os
import platform
import socket
import time
from datetime import datetime
from types import SimpleNamespace

import pytest
from scapy.all import ARP, ICMP, IP, Ether  # type: ignore[import-untyped]

from . import helper
from . import mac
from . import stats
from .helper import (
    NET_IPV4_MASK,
    NET_IPV4_SUBNET,
    NET_IPV6_PREFIX,
    NET_IPV6_PREFIX_LEN,
    VMNET_END_ADDRESS,
    VMNET_INTERFACE_ID,
    VMNET_MAC_ADDRESS,
    VMNET_MAX_PACKET_SIZE,
    VMNET_START_ADDRESS,
    VMNET_SUBNET_MASK,
)

# Enable broker tests on macOS >= 26
MACOS_26 = int(platform.mac_ver()[0].split(".")[0]) >= 26


# ARP operation codes (RFC 826)
# https://www.iana.org/assignments/arp-parameters/arp-parameters.xhtml
ARP_REQUEST = 1
ARP_REPLY = 2

# ICMP types (RFC 792)
# https://www.iana.org/assignments/icmp-parameters/icmp-parameters.xhtml
ICMP_ECHO_REQUEST = 8
ICMP_ECHO_REPLY = 0

VM_NAME = "test"

log = logging.getLogger("test")


def broker_installed():
    """
    Check if vmnet-broker is installed.

    This is not entirely correct since the plist may be installed but the
    broker may be unloaded. The correct check requires sudo (launchctl print),
    and we don't want to force developers to use sudo for running the tests.
    """
    return os.path.exists("/Library/LaunchDaemons/com.github.nirs.vmnet-broker.plist")


# --- Tests ---


class TestStart:
    """
    Test that vmnet-helper starts correctly with various options
    """

    def test_default_mode(self, tmp_path):
        """
        Test starting helper without mode default to "shared".
        """
        with run_helper(tmp_path=tmp_path) as (h, sock):
            self.check_interface(h.interface)
            # If network options are unset, vmnet selects the next available network.

    def test_shared_mode(self, tmp_path):
        """
        Test starting helper with shared mode
        """
        with run_helper(operation_mode="shared", tmp_path=tmp_path) as (h, sock):
            self.check_interface(h.interface)
            # If network options are unset, vmnet selects the next available network.

    def test_shared_mode_specific_network_16(self, tmp_path):
        """
        Test starting helper with 192.168.0.0/16 network (RFC 1918).
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="shared",
            start_address="192.168.200.1",
            end_address="192.168.200.254",
            subnet_mask="255.255.255.0",
        ) as (h, sock):
            self.check_interface(h.interface)
            self.check_specific_network(h)

    def test_shared_mode_specific_network_8(self, tmp_path):
        """
        Test starting helper with 10.0.0.0/8 network (RFC 1918).
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="shared",
            start_address="10.200.0.1",
            end_address="10.200.0.254",
            subnet_mask="255.255.255.0",
        ) as (h, sock):
            self.check_interface(h.interface)
            self.check_specific_network(h)

    def test_shared_mode_specific_network_12(self, tmp_path):
        """
        Test starting helper with 172.16.0.0/12 network (RFC 1918).
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="shared",
            start_address="172.16.200.1",
            end_address="172.16.200.254",
            subnet_mask="255.255.255.0",
        ) as (h, sock):
            self.check_interface(h.interface)
            self.check_specific_network(h)

    def test_shared_mode_specific_network_30(self, tmp_path):
        """
        Test starting helper with /30 subnet (1 usable address).
        anylinuxfs uses this to isolate the VM from other VMs on the network.
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="shared",
            start_address="192.168.200.1",
            end_address="192.168.200.2",
            subnet_mask="255.255.255.252",
        ) as (h, sock):
            self.check_interface(h.interface)
            self.check_specific_network(h)

    def test_shared_mode_specific_network_30_last(self, tmp_path):
        """
        Test starting helper with the last /30 subnet (1 usable address).
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="shared",
            start_address="192.168.200.253",
            end_address="192.168.200.254",
            subnet_mask="255.255.255.252",
        ) as (h, sock):
            self.check_interface(h.interface)
            self.check_specific_network(h)

    def test_shared_mode_isolated(self, tmp_path):
        """
        Test starting helper in shared mode with isolation
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="shared",
            enable_isolation=True,
        ) as (h, sock):
            self.check_interface(h.interface)

    def test_host_mode(self, tmp_path):
        """
        Test starting helper in host mode
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="host",
        ) as (h, sock):
            self.check_interface(h.interface)
            # If network options are unset, vmnet selects the next available network.

    def test_host_mode_specific_network_16(self, tmp_path):
        """
        Test starting helper with 192.168.0.0/16 network (RFC 1918).
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="host",
            start_address="192.168.200.1",
            end_address="192.168.200.254",
            subnet_mask="255.255.255.0",
        ) as (h, sock):
            self.check_interface(h.interface)
            self.check_specific_network(h)

    def test_host_mode_specific_network_8(self, tmp_path):
        """
        Test starting helper with 10.0.0.0/8 network (RFC 1918).
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="host",
            start_address="10.200.0.1",
            end_address="10.200.0.254",
            subnet_mask="255.255.255.0",
        ) as (h, sock):
            self.check_interface(h.interface)
            self.check_specific_network(h)

    def test_host_mode_specific_network_12(self, tmp_path):
        """
        Test starting helper with 172.16.0.0/12 network (RFC 1918).
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="host",
            start_address="172.16.200.1",
            end_address="172.16.200.254",
            subnet_mask="255.255.255.0",
        ) as (h, sock):
            self.check_interface(h.interface)
            self.check_specific_network(h)

    def test_host_mode_specific_network_30(self, tmp_path):
        """
        Test starting helper with /30 subnet (1 usable address).
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="host",
            start_address="192.168.200.1",
            end_address="192.168.200.2",
            subnet_mask="255.255.255.252",
        ) as (h, sock):
            self.check_interface(h.interface)
            self.check_specific_network(h)

    def test_host_mode_specific_network_30_last(self, tmp_path):
        """
        Test starting helper with the last /30 subnet (1 usable address).
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="host",
            start_address="192.168.200.253",
            end_address="192.168.200.254",
            subnet_mask="255.255.255.252",
        ) as (h, sock):
            self.check_interface(h.interface)
            self.check_specific_network(h)

    def test_host_mode_isolated(self, tmp_path):
        """
        Test starting helper in host mode with isolation
        """
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="host",
            enable_isolation=True,
        ) as (h, sock):
            self.check_interface(h.interface)

    def test_no_interface_id(self, tmp_path):
        """
        Test starting helper without --interface-id. vmnet should assign
        a new interface identifier and MAC address.
        """
        with run_helper(tmp_path=tmp_path, generate_interface_id=False) as (h, sock):
            assert VMNET_INTERFACE_ID in h.interface
            assert VMNET_MAC_ADDRESS in h.interface
            assert VMNET_MAX_PACKET_SIZE in h.interface

    def check_interface(self, interface):
        expected_id = helper.interface_id_from(VM_NAME)
        assert interface[VMNET_INTERFACE_ID].lower() == expected_id.lower()
        assert VMNET_MAC_ADDRESS in interface
        assert VMNET_START_ADDRESS in interface
        assert VMNET_END_ADDRESS in interface
        assert VMNET_SUBNET_MASK in interface
        assert VMNET_MAX_PACKET_SIZE in interface

    def check_specific_network(self, h):
        assert h.interface[VMNET_START_ADDRESS] == h.start_address
        assert h.interface[VMNET_END_ADDRESS] == h.end_address
        assert h.interface[VMNET_SUBNET_MASK] == h.subnet_mask


class TestConnectivity:
    """
    Test network connectivity using scapy
    """

    def test_arp_gateway(self, tmp_path):
        """
        Test ARP resolution to gateway
        """
        with run_helper(operation_mode="shared", tmp_path=tmp_path) as (h, sock):
            gateway_mac = arp_resolve(h, sock)
            assert gateway_mac is not None

    def test_ping_gateway(self, tmp_path):
        """
        Test ICMP ping to gateway
        """
        with run_helper(operation_mode="shared", tmp_path=tmp_path) as (h, sock):
            gateway_mac = arp_resolve(h, sock)
            gateway_ip = find_gateway_ip(h.interface)
            ping(h, sock, gateway_mac, gateway_ip)

    def test_ping_external_via_nat(self, tmp_path):
        """
        Test ICMP ping to external IP via NAT
        """
        external_ips = ["1.1.1.1", "8.8.8.8"]
        with run_helper(operation_mode="shared", tmp_path=tmp_path) as (h, sock):
            gateway_mac = arp_resolve(h, sock)
            retry(ping_any, h, sock, gateway_mac, external_ips)

    def test_partial_dhcp_range(self, tmp_path):
        """
        Test that vmnet accepts a DHCP range smaller than the full subnet,
        and that both gateway and NAT traffic work. This allows reserving
        addresses above --end-address for static assignment via /etc/bootptab.
        """
        external_ips = ["1.1.1.1", "8.8.8.8"]
        with run_helper(
            tmp_path=tmp_path,
            operation_mode="shared",
            start_address="192.168.200.1",
            end_address="192.168.200.200",
            subnet_mask="255.255.255.0",
        ) as (h, sock):
            assert h.interface[VMNET_END_ADDRESS] == "192.168.200.200"
            gateway_mac = arp_resolve(h, sock)
            gateway_ip = find_gateway_ip(h.interface)
            ping(h, sock, gateway_mac, gateway_ip)
            retry(ping_any, h, sock, gateway_mac, external_ips)


# On macOS >= 26 we can test also the --network option.
if MACOS_26:

    @pytest.mark.skipif(not broker_installed(), reason="vmnet-broker not installed")
    class TestNetworkStart:
        """
        Test starting helper with --network option (macOS 26 only)
        """

        def test_shared_network(self, tmp_path):
            """
            Test starting helper with shared network
            """
            with run_helper(network_name="shared", tmp_path=tmp_path) as (h, sock):
                self.check_interface(h.interface)

        def test_host_network(self, tmp_path):
            """
            Test starting helper with host network
            """
            with run_helper(network_name="host", tmp_path=tmp_path) as (h, sock):
                self.check_interface(h.interface)

        def check_interface(self, interface):
            # In --network mode the MAC address is generated from the VM name.
            expected_mac = mac.address_from(VM_NAME)
            assert interface[VMNET_MAC_ADDRESS] == expected_mac
            assert VMNET_MAX_PACKET_SIZE in interface
            # Network info keys
            assert NET_IPV4_SUBNET in interface
            assert NET_IPV4_MASK in interface
            assert NET_IPV6_PREFIX in interface
            assert NET_IPV6_PREFIX_LEN in interface

    @pytest.mark.skipif(not broker_installed(), reason="vmnet-broker not installed")
    class TestNetworkConnectivity:
        """
        Test network connectivity with --network option (macOS 26 only)
        """

        def test_arp_gateway(self, tmp_path):
            """
            Test ARP resolution to gateway
            """
            with run_helper(network_name="shared", tmp_path=tmp_path) as (h, sock):
                gateway_mac = arp_resolve(h, sock)
                assert gateway_mac is not None

        def test_ping_gateway(self, tmp_path):
            """
            Test ICMP ping to gateway
            """
            with run_helper(network_name="shared", tmp_path=tmp_path) as (h, sock):
                gateway_mac = arp_resolve(h, sock)
                gateway_ip = find_gateway_ip(h.interface)
                ping(h, sock, gateway_mac, gateway_ip)

        def test_ping_external_via_nat(self, tmp_path):
            """
            Test ICMP ping to external IP via NAT
            """
            external_ips = ["1.1.1.1", "8.8.8.8"]
            with run_helper(network_name="shared", tmp_path=tmp_path) as (h, sock):
                gateway_mac = arp_resolve(h, sock)
                retry(ping_any, h, sock, gateway_mac, external_ips)


class TestStats:
    """
    Test stats reporting via --stats-interval.
    """

    def test_stats_logged(self, tmp_path):
        """
        Test that stats are logged in valid JSON format after sending traffic.
        """
        with run_helper(stats_interval=1, tmp_path=tmp_path) as (h, sock):
            gateway_mac = arp_resolve(h, sock)
            gateway_ip = find_gateway_ip(h.interface)
            ping(h, sock, gateway_mac, gateway_ip)

            # Wait for the stats timer to fire.
            time.sleep(1.5)

        entries = list(stats.parse(h.logfile))
        assert len(entries) > 0, "No stats found in log"
        for s in entries:
            log.debug("stats: %s", s)

        entry = entries[0]
        assert "time" in entry
        datetime.fromisoformat(entry["time"])
        for endpoint in ("host", "vm"):
            for field in ("packets", "bytes", "drops"):
                assert field in entry[endpoint]
                assert isinstance(entry[endpoint][field], int)
        assert entry["host"]["packets"] > 0
        assert entry["host"]["bytes"] > 0

    def test_no_stats_by_default(self, tmp_path):
        """
        Test that stats are not logged when --stats-interval is not set.
        """
        with run_helper(tmp_path=tmp_path) as (h, sock):
            gateway_mac = arp_resolve(h, sock)
            gateway_ip = find_gateway_ip(h.interface)
            ping(h, sock, gateway_mac, gateway_ip)

            time.sleep(1.5)

        entries = list(stats.parse(h.logfile))
        assert len(entries) == 0, "Stats should not be logged by default"


# --- Helper runner ---


@contextlib.contextmanager
def run_helper(
    vm_name=VM_NAME,
    operation_mode=None,
    start_address=None,
    end_address=None,
    subnet_mask=None,
    shared_interface=None,
    network_name=None,
    enable_isolation=False,
    enable_offloading=False,
    stats_interval=None,
    tmp_path=None,
    generate_interface_id=True,
    verbose=True,
):
    """
    Context manager to run vmnet-helper with a socketpair.

    Yields (helper, sock) tuple where:
    - helper: Started Helper instance with interface info
    - sock: Host-side socket for sending/receiving packets

    Example:
        with run_helper(operation_mode="shared") as (h, sock):
            assert VMNET_MAC_ADDRESS in h.interface
            sock.send(packet)
    """
    args = SimpleNamespace(
        vm_name=vm_name,
        operation_mode=operation_mode,
        start_address=start_address,
        end_address=end_address,
        subnet_mask=subnet_mask,
        shared_interface=shared_interface,
        network_name=network_name,
        enable_isolation=enable_isolation,
        enable_offloading=enable_offloading,
        stats_interval=stats_interval,
        verbose=verbose,
    )

    logfile = str(tmp_path / "vmnet-helper.log") if tmp_path else None

    host_sock, vm_sock = helper.socketpair(enable_offloading)
    try:
        h = helper.Helper(
            args,
            fd=vm_sock.fileno(),
            logfile=logfile,
            generate_interface_id=generate_interface_id,
        )
        h.start()
        assert h.interface is not None  # Set by start()
        try:
            yield h, host_sock
        finally:
            h.stop()
    finally:
        host_sock.close()
        vm_sock.close()


# --- Network functions ---


def arp_resolve(h, sock, timeout=1.0):
    """
    Send ARP request to gateway and return gateway MAC address.

    This serves two purposes:
    1. We learn the gateway's MAC so we can address Ethernet frames to it.
    2. The gateway learns our MAC and IP so it can route replies back to us.
       Without this step, the gateway drops our ICMP packets since it has
       no ARP entry for our IP.

    We use the last IP in the subnet (vmnet_end_address) and assume no VM
    is using it. We don't check for address conflicts since RFC 5227
    requires sending 3 ARP probes over ~3 seconds, which would make the
    tests too slow. A conflict is very unlikely since we use the last
    address in the subnet.
    """
    gateway_ip = find_gateway_ip(h.interface)
    my_mac = h.interface[VMNET_MAC_ADDRESS]
    packet_size = h.interface[VMNET_MAX_PACKET_SIZE]
    my_ip = find_my_ip(h.interface)

    request = Ether(dst="ff:ff:ff:ff:ff:ff", src=my_mac) / ARP(
        op=ARP_REQUEST, hwsrc=my_mac, psrc=my_ip, pdst=gateway_ip
    )
    sock.send(bytes(request))
    log.info("Sent ARP request to %s", gateway_ip)

    # Wait for ARP reply, filtering out broadcast traffic.
    start = time.monotonic()
    deadline = start + timeout
    sock.settimeout(timeout)
    while time.monotonic() < deadline:
        try:
            response = sock.recv(packet_size)
        except socket.timeout:
            continue
        reply = Ether(response)
        if (
            reply.haslayer(ARP)
            and reply[ARP].op == ARP_REPLY
            and reply[ARP].psrc == gateway_ip
        ):
            elapsed = time.monotonic() - start
            log.info("Got ARP reply in %.6f seconds", elapsed)
            return reply[ARP].hwsrc

    raise AssertionError(f"No ARP reply from {gateway_ip}")


def ping(h, sock, gateway_mac, target_ip, timeout=1.0):
    """
    Send ICMP echo request and wait for reply.
    """
    gateway_ip = find_gateway_ip(h.interface)
    my_mac = h.interface[VMNET_MAC_ADDRESS]
    packet_size = h.interface[VMNET_MAX_PACKET_SIZE]
    my_ip = find_my_ip(h.interface)

    request = (
        Ether(dst=gateway_mac, src=my_mac)
        / IP(src=my_ip, dst=target_ip)
        / ICMP(type=ICMP_ECHO_REQUEST)
    )
    sock.send(bytes(request))
    log.info("Sent ICMP echo request to %s", target_ip)

    # Wait for ICMP reply, filtering out broadcast traffic.
    start = time.monotonic()
    deadline = start + timeout
    sock.settimeout(timeout)
    while time.monotonic() < deadline:
        try:
            response = sock.recv(packet_size)
        except socket.timeout:
            continue
        pkt = Ether(response)
        if pkt.haslayer(ICMP) and pkt[ICMP].type == ICMP_ECHO_REPLY:
            assert pkt[IP].src == target_ip, f"Expected reply from {target_ip}"
            elapsed = time.monotonic() - start
            log.info("Got ICMP reply in %.6f seconds", elapsed)
            return

    raise AssertionError(f"No ICMP echo reply from {target_ip}")


def ping_any(h, sock, gateway_mac, ips):
    """
    Try to ping any of the IPs, raise if all fail
    """
    for ip in ips:
        try:
            ping(h, sock, gateway_mac, ip)
            return
        except AssertionError:
            log.info("Failed to ping %s, trying next", ip)

    raise AssertionError(f"No reply from any of {ips}")


# --- Utilities ---


def find_gateway_ip(interface):
    """
    Return gateway IP, supporting both modes.
    """
    for key in (VMNET_START_ADDRESS, NET_IPV4_SUBNET):
        if key in interface:
            return interface[key]

    raise AssertionError("No gateway address in interface")


def find_my_ip(interface):
    """
    Return usable IP for this client, supporting both modes.

    Uses the last IP in the subnet. This assumes no VM is using this address,
    which works in CI when the network is empty. May conflict locally if a VM
    happens to use the same address, but this is very unlikely.
    """
    if VMNET_END_ADDRESS in interface:
        return interface[VMNET_END_ADDRESS]
    # --network mode: calculate from subnet and mask
    subnet = interface[NET_IPV4_SUBNET]
    mask = interface[NET_IPV4_MASK]
    network = ipaddress.IPv4Network(f"{subnet}/{mask}", strict=False)
    return str(network.broadcast_address - 1)


def retry(func, *args, retries=10, **kwargs):
    """
    Retry a function up to `retries` times on AssertionError.
    """
    for i in range(retries):
        try:
            return func(*args, **kwargs)
        except AssertionError as e:
            if i == retries - 1:
                raise
            log.info("Retry %d/%d: %s", i + 1, retries, e)
