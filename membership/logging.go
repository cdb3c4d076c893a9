package membership

import (
	"bytes"
	"io"

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
