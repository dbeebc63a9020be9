package vhostuser

import (
	"encoding/binary"
	"fmt"
)

// Request is a vhost-user message's type (the frontend's requests).
type Request uint32

// The requests this backend knows (vhost-user.rst, "Front-end message
// types").
const (
	GetFeatures         Request = 1
	SetFeatures         Request = 2
	SetOwner            Request = 3
	ResetOwner          Request = 4
	SetMemTable         Request = 5
	SetLogBase          Request = 6
	SetLogFD            Request = 7
	SetVringNum         Request = 8
	SetVringAddr        Request = 9
	SetVringBase        Request = 10
	GetVringBase        Request = 11
	SetVringKick        Request = 12
	SetVringCall        Request = 13
	SetVringErr         Request = 14
	GetProtocolFeatures Request = 15
	SetProtocolFeatures Request = 16
	GetQueueNum         Request = 17
	SetVringEnable      Request = 18
	SendRARP            Request = 19
	NetSetMTU           Request = 20
)

func (r Request) String() string {
	names := map[Request]string{GetFeatures: "GET_FEATURES", SetFeatures: "SET_FEATURES", SetOwner: "SET_OWNER",
		ResetOwner: "RESET_OWNER", SetMemTable: "SET_MEM_TABLE", SetLogBase: "SET_LOG_BASE", SetLogFD: "SET_LOG_FD",
		SetVringNum: "SET_VRING_NUM", SetVringAddr: "SET_VRING_ADDR", SetVringBase: "SET_VRING_BASE",
		GetVringBase: "GET_VRING_BASE", SetVringKick: "SET_VRING_KICK", SetVringCall: "SET_VRING_CALL",
		SetVringErr: "SET_VRING_ERR", GetProtocolFeatures: "GET_PROTOCOL_FEATURES",
		SetProtocolFeatures: "SET_PROTOCOL_FEATURES", GetQueueNum: "GET_QUEUE_NUM", SetVringEnable: "SET_VRING_ENABLE",
		SendRARP: "SEND_RARP", NetSetMTU: "NET_SET_MTU"}
	if n, ok := names[r]; ok {
		return n
	}
	return fmt.Sprintf("request %d", uint32(r))
}

// A message header's flags: the version (1, in the low two bits), a
// reply, and a request that wants one (REPLY_ACK).
const (
	flagVersion   = 0x1
	flagReply     = 0x4
	flagNeedReply = 0x8
	versionMask   = 0x3
)

// HeaderSize is a message header's size: request, flags, payload size.
const HeaderSize = 12

// MaxPayload bounds a payload: the largest this backend reads is a memory
// table of maxRegions (8 + 8 * 32 bytes); anything longer is refused.
const MaxPayload = 4096

// maxRegions is how many memory regions a table may hold (the spec's
// VHOST_MEMORY_BASELINE_NREGIONS), and maxFDs how many descriptors a
// message may carry.
const (
	maxRegions = 8
	maxFDs     = 8
)

// Feature bits: the device's (virtio) and vhost-user's own.
const (
	// FeatureVersion1 is VIRTIO_F_VERSION_1: the 12-byte virtio-net header.
	FeatureVersion1 = 1 << 32
	// FeatureProtocolFeatures is VHOST_USER_F_PROTOCOL_FEATURES: the
	// protocol features are negotiated, and rings start disabled.
	FeatureProtocolFeatures = 1 << 30
	// ProtocolReplyAck is VHOST_USER_PROTOCOL_F_REPLY_ACK.
	ProtocolReplyAck = 1 << 3
)

// virtio-net's offloads (virtio 1.x, 5.1.3): what the guest may send
// (CSUM, HOST_TSO*) and what it takes (GUEST_CSUM, GUEST_TSO*).
const (
	FeatureCSum      = 1 << 0
	FeatureGuestCSum = 1 << 1
	FeatureGuestTSO4 = 1 << 7
	FeatureGuestTSO6 = 1 << 8
	FeatureHostTSO4  = 1 << 11
	FeatureHostTSO6  = 1 << 12
	// featureMTU is VIRTIO_NET_F_MTU, which qemu sets for host_mtu= on
	// its own (mtu_bypass_backend): accepted, and left to qemu.
	featureMTU = 1 << 3
)

// Features is what the backend offers; OffloadFeatures what it adds for a
// port whose frames carry the virtio-net header (Config.VnetHdr); and
// ProtocolFeatures its protocol features.
const (
	Features         = FeatureVersion1 | FeatureProtocolFeatures
	OffloadFeatures  = FeatureCSum | FeatureGuestCSum | FeatureGuestTSO4 | FeatureGuestTSO6 | FeatureHostTSO4 | FeatureHostTSO6
	ProtocolFeatures = ProtocolReplyAck
)

// NetHeaderSize is the virtio-net header with VIRTIO_F_VERSION_1: flags,
// gso_type, hdr_len, gso_size, csum_start, csum_offset, num_buffers.
const NetHeaderSize = 12

// The queues of the one pair: the guest receives on 0, sends on 1.
const (
	rxQueue   = 0
	txQueue   = 1
	numQueues = 2
)

// maxQueueSize is the largest ring (virtio's split ring: 32768).
const maxQueueSize = 32768

// vringFDInvalid is the bit of a SET_VRING_KICK, _CALL or _ERR payload
// that says no descriptor came (polling, or no interrupt), and
// vringIndexMask the ring's index in it.
const (
	vringFDInvalid = 0x100
	vringIndexMask = 0xff
)

// Header is a message's header.
type Header struct {
	Request Request
	Flags   uint32
	Size    uint32
}

func (h Header) encode() []byte {
	b := make([]byte, HeaderSize)
	binary.LittleEndian.PutUint32(b[0:], uint32(h.Request))
	binary.LittleEndian.PutUint32(b[4:], h.Flags)
	binary.LittleEndian.PutUint32(b[8:], h.Size)
	return b
}

func decodeHeader(b []byte) Header {
	return Header{Request: Request(binary.LittleEndian.Uint32(b[0:])), Flags: binary.LittleEndian.Uint32(b[4:]),
		Size: binary.LittleEndian.Uint32(b[8:])}
}

// VringState is the payload of SET_VRING_NUM, SET_VRING_BASE and
// GET_VRING_BASE: a ring's index and a number.
type VringState struct {
	Index, Num uint32
}

func (s VringState) encode() []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint32(b[0:], s.Index)
	binary.LittleEndian.PutUint32(b[4:], s.Num)
	return b
}

// VringAddr is SET_VRING_ADDR's payload: where a ring's parts are, as
// addresses of the VMM's own (user addresses, which the memory table
// maps).
type VringAddr struct {
	Index, Flags           uint32
	Desc, Used, Avail, Log uint64
}

const vringAddrSize = 40

func (a VringAddr) encode() []byte {
	b := make([]byte, vringAddrSize)
	binary.LittleEndian.PutUint32(b[0:], a.Index)
	binary.LittleEndian.PutUint32(b[4:], a.Flags)
	binary.LittleEndian.PutUint64(b[8:], a.Desc)
	binary.LittleEndian.PutUint64(b[16:], a.Used)
	binary.LittleEndian.PutUint64(b[24:], a.Avail)
	binary.LittleEndian.PutUint64(b[32:], a.Log)
	return b
}

// Region is a memory region of SET_MEM_TABLE: guest physical address,
// size, the VMM's user address, and the offset of the region in the
// descriptor sent with it.
type Region struct {
	GuestAddr, Size, UserAddr, MmapOffset uint64
}

const regionSize = 32

// encodeMemTable is SET_MEM_TABLE's payload for regions.
func encodeMemTable(regions []Region) []byte {
	b := make([]byte, 8+regionSize*len(regions))
	binary.LittleEndian.PutUint32(b[0:], uint32(len(regions)))
	for i, r := range regions {
		o := 8 + regionSize*i
		binary.LittleEndian.PutUint64(b[o:], r.GuestAddr)
		binary.LittleEndian.PutUint64(b[o+8:], r.Size)
		binary.LittleEndian.PutUint64(b[o+16:], r.UserAddr)
		binary.LittleEndian.PutUint64(b[o+24:], r.MmapOffset)
	}
	return b
}

// decodeMemTable reads SET_MEM_TABLE's payload: at most maxRegions, each
// of a size that is not zero.
func decodeMemTable(p []byte) ([]Region, error) {
	if len(p) < 8 {
		return nil, fmt.Errorf("a memory table of %d bytes", len(p))
	}
	n := binary.LittleEndian.Uint32(p)
	if n == 0 || n > maxRegions {
		return nil, fmt.Errorf("a memory table of %d regions (1 to %d)", n, maxRegions)
	}
	if uint64(len(p)) < 8+uint64(n)*regionSize {
		return nil, fmt.Errorf("a memory table of %d regions in %d bytes", n, len(p))
	}
	regions := make([]Region, n)
	for i := range regions {
		o := 8 + regionSize*i
		r := Region{GuestAddr: binary.LittleEndian.Uint64(p[o:]), Size: binary.LittleEndian.Uint64(p[o+8:]),
			UserAddr: binary.LittleEndian.Uint64(p[o+16:]), MmapOffset: binary.LittleEndian.Uint64(p[o+24:])}
		if r.Size == 0 || r.GuestAddr+r.Size < r.GuestAddr || r.UserAddr+r.Size < r.UserAddr || r.MmapOffset+r.Size < r.MmapOffset {
			return nil, fmt.Errorf("memory region %d: size %d at guest %#x, user %#x, offset %#x", i, r.Size, r.GuestAddr, r.UserAddr, r.MmapOffset)
		}
		regions[i] = r
	}
	return regions, nil
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
