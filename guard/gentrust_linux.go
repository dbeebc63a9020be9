package guard

import (
	"hash/maphash"
	"net/netip"
	"time"
)

// genTrust tells a guard's resync when it may trust what it last read of
// its sets without reading them again: the namespace's nftables
// generation (hostnet.NFTGeneration) counts every committed transaction,
// so sets read at generation g are unchanged while it stands. But the
// kernel publishes a commit's generation before it makes the commit's
// elements visible, and a read in between sees the new generation with
// the old elements: one read at g proves nothing. So a read is trusted
// once a second full read at the same generation, at least TrustGap
// after the first, found the same (digest): the kernel's window between
// the two is a few instructions, which two reads a second apart do not
// both fall in unless the committer stopped there as long. Even then the
// sets are read again every trustedSkips resyncs, a backstop for any
// change that would not move the generation. Its zero value trusts
// nothing.
type genTrust struct {
	ok      bool   // a full read at gen found digest
	gen     uint32 // the generation read before the sets
	digest  uint64
	at      time.Time // when that read began
	trusted bool      // the read before it found the same at the same generation
	skips   int       // reads skipped since the last full one
}

// trustedSkips is how many resyncs in a row may trust a read.
const trustedSkips = 20

// TrustGap is the least time between two reads of a guard's sets that
// together make a trusted one.
const TrustGap = time.Second

// skip tells whether a resync at generation gen, which wants the sets to
// hold digest, may trust the last read instead of reading them again.
func (t *genTrust) skip(gen uint32, digest uint64) bool {
	if !t.trusted || !t.ok || t.gen != gen || t.digest != digest || t.skips >= trustedSkips {
		return false
	}
	t.skips++
	return true
}

// read records a full read of the sets, begun at now, at generation gen
// (read before them), that found them to be digest; clean false (a read
// that found them wrong and wrote, or failed) trusts nothing.
func (t *genTrust) read(gen uint32, digest uint64, clean bool, now time.Time) {
	if !clean {
		*t = genTrust{}
		return
	}
	if t.ok && t.gen == gen && t.digest == digest && now.Sub(t.at) < TrustGap && !t.trusted {
		return // (too soon after the first to vouch for it)
	}
	again := t.ok && t.gen == gen && t.digest == digest
	*t = genTrust{ok: true, gen: gen, digest: digest, at: now, trusted: again}
}

// forget trusts nothing: the sets were written.
func (t *genTrust) forget() { *t = genTrust{} }

// elemHash is a hash of one element of a guard's sets: a MAC as text (or
// none), an address and a tag telling the sets apart, under h's seed (a
// guard's own random one: a guest cannot choose addresses whose hashes
// collide). A digest of the sets sums the hashes of their elements, in
// any order, and adds their number.
func elemHash(h *maphash.Hash, mac string, ip netip.Addr, tag byte) uint64 {
	h.Reset()
	h.WriteString(mac)
	b := ip.As16()
	h.Write(b[:])
	h.WriteByte(tag)
	return h.Sum64()
}
