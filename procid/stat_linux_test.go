package procid

import (
	"os"
	"testing"
)

// TestParseStat: the fields are counted from the last ')', whatever the
// command name holds; a short or garbled line is an error.
func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses, as a process may set it.
	line := "4242 (vm (a) b) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 50 0 0 20 0 8 0 123456 1000000 500 18446744073709551615\n"
	s, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if want := (Stat{State: 'S', Flags: 4194560, UTime: 250, STime: 50, StartTime: 123456, RSSPages: 500}); s != want {
		t.Errorf("ParseStat = %+v, want %+v", s, want)
	}
	for _, bad := range []string{"4242 (x) S 1 2", "no parenthesis", "4242 (x) S 1 4242 4242 0 -1 x 1234 0 0 0 250 50 0 0 20 0 8 0 123456 1000000 500"} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q) parsed", bad)
		}
	}
}

// TestReadStatSelf: this process is running, its start time is the one
// Read records, and a read allocates a few small strings, not the file.
func TestReadStatSelf(t *testing.T) {
	s, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	id, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.State != 'R' && s.State != 'S' || s.StartTime != id.StartTime || s.RSSPages == 0 {
		t.Errorf("ReadStat(self) = %+v, Read's start time %d", s, id.StartTime)
	}
	if n := testing.AllocsPerRun(50, func() { ReadStat(os.Getpid()) }); n > 8 {
		t.Errorf("ReadStat allocates %v times", n)
	}
}
