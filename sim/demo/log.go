package demo

import (
	"io"
	"os"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// Logger is the demo's log: readable lines on w, coloured only when w is a
// terminal (a log redirected to a file or a pipe gets no escape codes).
// Quiet, the default, keeps errors only: the scenario prints its own steps,
// and a clean run logs nothing.
func Logger(w io.Writer, verbose bool) zerolog.Logger {
	color := false
	if f, ok := w.(*os.File); ok {
		color = isatty.IsTerminal(f.Fd())
	}
	level := zerolog.ErrorLevel
	if verbose {
		level = zerolog.InfoLevel
	}
	return zerolog.New(zerolog.ConsoleWriter{Out: w, NoColor: !color}).Level(level).With().Timestamp().Logger()
}
