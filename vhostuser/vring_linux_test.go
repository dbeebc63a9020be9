package vhostuser

import (
	"encoding/binary"
	"testing"
	"unsafe"
)

// FuzzChain: whatever the guest writes in its ring and descriptors (the
// fuzzer's bytes, over the whole of a small memory), taking chains never
// panics, ends (a ring of 16 entries, at most as many chains as it holds
// and more), and gives buffers inside the guest's memory only.
func FuzzChain(f *testing.F) {
	seed := make([]byte, 1024)
	// A good ring: avail idx 1, head 0; descriptor 0: 64 bytes at 512.
	binary.LittleEndian.PutUint64(seed[0:], fuzzGuest+512)
	binary.LittleEndian.PutUint32(seed[8:], 64)
	binary.LittleEndian.PutUint16(seed[fuzzAvail+2:], 1)
	f.Add(seed, uint16(0))
	loop := append([]byte(nil), seed...)
	binary.LittleEndian.PutUint16(loop[12:], descFNext)
	f.Add(loop, uint16(0))
	f.Fuzz(func(t *testing.T, data []byte, last uint16) {
		mem := make([]byte, 1024)
		copy(mem, data)
		m := &Memory{regions: []memRegion{{Region: Region{GuestAddr: fuzzGuest, Size: uint64(len(mem)), UserAddr: fuzzUser}, data: mem}}}
		var q vring
		if err := q.setup(m, 16, VringAddr{Desc: fuzzUser, Avail: fuzzUser + fuzzAvail, Used: fuzzUser + fuzzUsed}); err != nil {
			t.Fatal(err)
		}
		q.lastAvail = last
		lo, hi := uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&mem[0]))+uintptr(len(mem))
		var c chain
		for range 40 {
			ok, err := q.next(&c)
			if err != nil || !ok {
				return
			}
			for _, b := range append(append([][]byte(nil), c.read...), c.written...) {
				if len(b) == 0 {
					continue
				}
				p := uintptr(unsafe.Pointer(&b[0]))
				if p < lo || p+uintptr(len(b)) > hi {
					t.Fatalf("a buffer of %d bytes outside the guest's memory", len(b))
				}
			}
			q.putUsed(c.head, 0)
			q.publishUsed()
		}
	})
}

// The fuzzed memory's layout: descriptors (16 of 16 bytes) at 0, the
// available ring at fuzzAvail, the used ring at fuzzUsed.
const (
	fuzzGuest = 0x10000
	fuzzUser  = 0x7000000
	fuzzAvail = 256
	fuzzUsed  = 512 + 128
)

// FuzzMessages: whatever a VMM sends as messages (the fuzzer's bytes cut
// into requests and payloads, without descriptors), a session answers or
// ends with an error, never panics, and holds nothing when it ends.
func FuzzMessages(f *testing.F) {
	f.Add([]byte{byte(GetFeatures), 0, 8, byte(SetVringNum), 8, 0, 0, 0, 0, 1, 0, 0})
	f.Add([]byte{byte(SetMemTable), 40, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{byte(SetVringAddr), 40, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newSession(New(Config{Port: -1}), nil)
		defer s.close()
		for len(data) >= 2 {
			r, n := Request(data[0]%24), int(data[1])
			data = data[2:]
			n = min(n, len(data))
			payload := data[:n]
			data = data[n:]
			if _, err := s.handle(Header{Request: r, Flags: flagVersion}, payload, nil); err != nil {
				return
			}
		}
	})
}
