package nodeagent

import (
	"net"
	"time"
)

// SetTCPAttachTimeout sets how long a TCP connection may take to send its attach, for the
// test of it; restore sets it back.
func SetTCPAttachTimeout(d time.Duration) (restore func()) {
	was := tcpAttachTimeout
	tcpAttachTimeout = d
	return func() { tcpAttachTimeout = was }
}

// AcceptedConns are the processes' connections the server holds open now.
func (n *Server) AcceptedConns() []net.Conn {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []net.Conn
	for c := range n.clients {
		out = append(out, c.conn)
	}
	return out
}
