package classify

import "bytes"

// MaxEventBytes bounds one SSE event's data (and one line). A larger event
// is skipped, so memory per stream stays bounded whatever the provider
// sends.
const MaxEventBytes = 1 << 20

// sseParser splits an event stream into events incrementally (the WHATWG
// event-stream format: lines ended by CRLF, LF or CR; "event:" and "data:"
// fields; a blank line dispatches). Chunks may split it at any byte.
type sseParser struct {
	line     []byte
	data     []byte
	event    []byte
	hasData  bool
	skipLine bool // the current line outgrew MaxEventBytes
	skipData bool // the current event outgrew MaxEventBytes
	afterCR  bool
	oversize int
	onEvent  func(event, data []byte)
}

func (p *sseParser) feed(b []byte) {
	for len(b) > 0 {
		if p.afterCR {
			p.afterCR = false
			if b[0] == '\n' {
				b = b[1:]
				continue
			}
		}
		i := lineEnd(b)
		if i < len(b) && len(p.line) == 0 && !p.skipLine {
			// The whole line is in this chunk (the common case): read it
			// in place, without copying it first.
			if i > MaxEventBytes {
				p.oversize++
				p.skipData = true
			} else {
				p.onLine(b[:i])
			}
			p.afterCR = b[i] == '\r'
			b = b[i+1:]
			continue
		}
		if !p.skipLine {
			if len(p.line)+i > MaxEventBytes {
				p.skipLine, p.line = true, p.line[:0]
				p.oversize++
			} else {
				p.line = append(p.line, b[:i]...)
			}
		}
		if i == len(b) {
			return // the line continues in the next chunk
		}
		p.afterCR = b[i] == '\r'
		b = b[i+1:]
		p.endLine()
	}
}

// lineEnd returns the index of the first CR or LF in b, len(b) if none.
// Two vectorised byte searches beat one byte-by-byte loop over a chunk.
func lineEnd(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		i = len(b)
	}
	if j := bytes.IndexByte(b[:i], '\r'); j >= 0 {
		return j
	}
	return i
}

func (p *sseParser) endLine() {
	if p.skipLine {
		p.skipLine = false
		p.skipData = true
		return
	}
	line := p.line
	p.line = p.line[:0]
	p.onLine(line)
}

// onLine handles one complete line (without its end).
func (p *sseParser) onLine(line []byte) {
	if len(line) == 0 {
		p.dispatch()
		return
	}
	if line[0] == ':' {
		return // comment / keep-alive
	}
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
		if p.skipData {
			return
		}
		if len(p.data)+len(value)+1 > MaxEventBytes {
			p.skipData, p.data = true, p.data[:0]
			p.oversize++
			return
		}
		if p.hasData {
			p.data = append(p.data, '\n')
		}
		p.data = append(p.data, value...)
		p.hasData = true
	case "event":
		p.event = append(p.event[:0], value...)
	}
}

func (p *sseParser) dispatch() {
	if (p.hasData || len(p.event) > 0) && !p.skipData {
		p.onEvent(p.event, p.data)
	}
	p.data, p.event = p.data[:0], p.event[:0]
	p.hasData, p.skipData = false, false
}

// close dispatches an event left without its final blank line.
func (p *sseParser) close() {
	if len(p.line) > 0 || p.skipLine {
		p.endLine()
	}
	p.dispatch()
}
