package qbroker

// Test hooks, compiled into tests only.

// AckToken returns m's ack token.
func AckToken(m *Message) string { return m.token }

// WithAckToken returns a message like m (without its consumer) that
// carries token.
func WithAckToken(m *Message, token string) *Message {
	return &Message{Queue: m.Queue, ID: m.ID, client: m.client, token: token}
}
