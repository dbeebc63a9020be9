package ctlapi

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/net/bpf"
)

// CaptureTrailer is the trailer of GET /v1/capture, after the pcapng
// stream: "frames=N dropped=M", and "; ERROR" if the capture failed once
// it had begun.
const CaptureTrailer = "Vmnetctl-Capture"

// kernelRuns reports what x/net/bpf decodes but the kernel's checker
// refuses: LDX in other modes than IMM, MEM, LEN and MSH, MSH with LD,
// a division or remainder by the constant 0.
func kernelRuns(r bpf.RawInstruction) bool {
	const (
		classLD, classLDX, classALU = 0x00, 0x01, 0x04
		modeABS, modeIND, modeMSH   = 0x20, 0x40, 0xa0
		opDIV, opMOD, srcK          = 0x30, 0x90, 0x00
	)
	class, mode := r.Op&0x07, r.Op&0xe0
	switch {
	case class == classLDX && (mode == modeABS || mode == modeIND):
		return false
	case class == classLD && mode == modeMSH:
		return false
	case class == classALU && r.Op&0x08 == srcK && (r.Op&0xf0 == opDIV || r.Op&0xf0 == opMOD) && r.K == 0:
		return false
	}
	return true
}

// MaxFilter bounds a capture's filter: the kernel's BPF_MAXINSNS.
const MaxFilter = 4096

// EncodeFilter is a classic BPF program as GET /v1/capture's filter
// parameter: its length, then its instructions, "op jt jf k" each, all
// separated by commas (tcpdump -ddd's lines).
func EncodeFilter(p []bpf.RawInstruction) string {
	var b strings.Builder
	b.WriteString(strconv.Itoa(len(p)))
	for _, r := range p {
		fmt.Fprintf(&b, ",%d %d %d %d", r.Op, r.Jt, r.Jf, r.K)
	}
	return b.String()
}

// DecodeFilter reads what EncodeFilter wrote (or tcpdump -ddd, its lines
// joined by commas), and refuses a program the kernel would: one longer
// than MaxFilter, an instruction it does not know, a jump past the end,
// a last instruction that returns nothing.
func DecodeFilter(s string) ([]bpf.RawInstruction, error) {
	fields := strings.Split(strings.TrimSpace(s), ",")
	n, err := strconv.Atoi(strings.TrimSpace(fields[0]))
	if err != nil || n < 1 || n > MaxFilter || n != len(fields)-1 {
		return nil, fmt.Errorf("a filter is 1 to %d instructions, their number first", MaxFilter)
	}
	p := make([]bpf.RawInstruction, n)
	for i, f := range fields[1:] {
		var v [4]uint64
		words := strings.Fields(f)
		ok := len(words) == 4
		for j := 0; ok && j < 4; j++ {
			var err error
			v[j], err = strconv.ParseUint(words[j], 10, 32)
			ok = err == nil
		}
		if !ok || v[0] > 0xffff || v[1] > 0xff || v[2] > 0xff {
			return nil, fmt.Errorf("the filter's instruction %d, %q, is not \"op jt jf k\"", i, f)
		}
		r := bpf.RawInstruction{Op: uint16(v[0]), Jt: uint8(v[1]), Jf: uint8(v[2]), K: uint32(v[3])}
		ins := r.Disassemble()
		if _, unknown := ins.(bpf.RawInstruction); unknown || !kernelRuns(r) {
			return nil, fmt.Errorf("the filter's instruction %d, %q, is none the kernel runs", i, f)
		}
		switch j := ins.(type) {
		case bpf.Jump:
			if i+1+int(j.Skip) >= n {
				return nil, fmt.Errorf("the filter's instruction %d jumps past its end", i)
			}
		case bpf.JumpIf, bpf.JumpIfX:
			if i+1+max(int(r.Jt), int(r.Jf)) >= n {
				return nil, fmt.Errorf("the filter's instruction %d jumps past its end", i)
			}
		}
		p[i] = r
	}
	switch p[n-1].Disassemble().(type) {
	case bpf.RetA, bpf.RetConstant:
	default:
		return nil, errors.New("the filter's last instruction returns nothing")
	}
	return p, nil
}
