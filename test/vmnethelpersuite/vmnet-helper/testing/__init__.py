# SPDX-FileCopyrightText: The vmnet-helper authors
# SPDX-License-Identifier: Apache-2.0

from .disks import IMAGES
from .helper import (
    RUNNER,
    Helper,
    NET_IPV4_MASK,
    NET_IPV4_SUBNET,
    NET_IPV6_PREFIX,
    NET_IPV6_PREFIX_LEN,
    OPERATION_MODES,
    VMNET_END_ADDRESS,
    VMNET_MAC_ADDRESS,
    VMNET_MAX_PACKET_SIZE,
    VMNET_START_ADDRESS,
    VMNET_SUBNET_MASK,
    requires_root,
    shared_interfaces,
    socketpair,
)
from .store import vm_path
from .vm import (
    VM,
    DRIVERS,
)
from .mac import address_from as mac_address_from
