package classify

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
		i := 0
		for i < len(b) && b[i] != '\n' && b[i] != '\r' {
			i++
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

func (p *sseParser) endLine() {
	if p.skipLine {
		p.skipLine = false
		p.skipData = true
		return
	}
	line := p.line
	p.line = p.line[:0]
	if len(line) == 0 {
		p.dispatch()
		return
	}
	if line[0] == ':' {
		return // comment / keep-alive
	}
	field, value := line, []byte(nil)
	for i, c := range line {
		if c == ':' {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
			break
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
