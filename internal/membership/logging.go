package membership

import (
	"bytes"
	"io"
	"log"

	"github.com/rs/zerolog"
)

// logWriter turns memberlist's log lines ("[WARN] memberlist: ...") into
// zerolog events at the matching level with component=memberlist.
// memberlist writes through a *log.Logger, which calls Write once per line.
type logWriter struct {
	log zerolog.Logger
}

var _ io.Writer = logWriter{}

func newLogWriter(l zerolog.Logger) logWriter {
	return logWriter{log: l.With().Str("subsystem", "memberlist").Logger()}
}

func (w logWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimRight(p, "\r\n"), []byte("\n")) {
		level, msg := parseLogLine(line)
		if level == zerolog.ErrorLevel && peerHiccup(msg) {
			level = zerolog.WarnLevel
		}
		// memberlist logs every stream connection at debug; skip the
		// allocation when the line would be dropped anyway.
		if len(msg) == 0 || level < w.log.GetLevel() || level < zerolog.GlobalLevel() {
			continue
		}
		w.log.WithLevel(level).Msg(string(msg))
	}
	// Always report the whole buffer as written: a logger must not fail
	// memberlist's caller.
	return len(p), nil
}

// parseLogLine finds the level tag, which may follow a log.Logger timestamp,
// and strips it and the "memberlist: " prefix. Untagged lines log at info.
func parseLogLine(line []byte) (zerolog.Level, []byte) {
	level := zerolog.InfoLevel
	msg := line
	if open := bytes.IndexByte(line, '['); open >= 0 {
		if n := bytes.IndexByte(line[open:], ']'); n > 0 {
			if l, ok := tagLevel(string(line[open+1 : open+n])); ok {
				level = l
				msg = line[open+n+1:]
			}
		}
	}
	msg = bytes.TrimSpace(msg)
	msg = bytes.TrimPrefix(msg, []byte("memberlist: "))
	return level, msg
}

// tagLevel maps memberlist's level tags; ERROR is not one of them but costs
// nothing to accept.
func tagLevel(tag string) (zerolog.Level, bool) {
	switch tag {
	case "DEBUG":
		return zerolog.DebugLevel, true
	case "INFO":
		return zerolog.InfoLevel, true
	case "WARN":
		return zerolog.WarnLevel, true
	case "ERR", "ERROR":
		return zerolog.ErrorLevel, true
	default:
		return zerolog.NoLevel, false
	}
}

// peerExchanges start memberlist's ERR lines about one exchange with one
// peer: a probe, a push/pull, a stream it sent.
var peerExchanges = [][]byte{
	[]byte("Failed fallback TCP ping"), []byte("Push/Pull with "), []byte("failed to receive: "),
	[]byte("Failed to send error: "), []byte("Failed to send ack: "), []byte("Failed to send nack: "),
	[]byte("Failed to send gossip to "), []byte("Failed to send UDP ping"), []byte("Failed to send indirect"),
	[]byte("Failed to send UDP compound ping"), []byte("Failed to forward ack"),
	[]byte("Failed to push local state"), []byte("Failed to read remote state"),
}

// cutShort are the errors of an exchange that a slow, busy or departed peer
// cuts short: a timeout, a reset, a closed connection, a partition.
var cutShort = [][]byte{
	[]byte("i/o timeout"), []byte("connection reset by peer"), []byte("broken pipe"), []byte("EOF"),
	[]byte("connection refused"), []byte("use of closed network connection"), []byte("fault network:"),
}

// peerHiccup says whether an ERR line of memberlist's is about one exchange
// with one peer cut short, or about memberlist shedding push/pulls it has no
// time for. That is the failure detector's everyday input, which it answers
// by suspecting the peer (and logging it when it does); on a loaded host it
// comes every few seconds, so it logs at warn. An ERR that says something
// is misconfigured or malformed here (a label, a key, a message that does
// not decode) stays an error.
func peerHiccup(msg []byte) bool {
	if bytes.HasPrefix(msg, []byte("Too many pending push/pull requests")) {
		return true
	}
	exchange := false
	for _, p := range peerExchanges {
		exchange = exchange || bytes.HasPrefix(msg, p)
	}
	if !exchange {
		return false
	}
	for _, e := range cutShort {
		if bytes.Contains(msg, e) {
			return true
		}
	}
	return false
}

// MemberlistLogger is a standard logger for memberlist's own lines: each goes
// to l (subsystem=membership) at the level its [DEBUG]/[WARN]/[ERR] prefix
// names.
func MemberlistLogger(l zerolog.Logger) *log.Logger {
	return log.New(newLogWriter(l.With().Str("subsystem", "membership").Logger()), "", 0)
}
