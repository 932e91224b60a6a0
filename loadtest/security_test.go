package main

import (
	"io"
	"strings"
	"testing"
)

func TestSecurityFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string // "" means accepted
	}{
		{[]string{"--spawn-brokers", "1", "--spawn-secure"}, ""},
		{[]string{"--broker", "127.0.0.1:7070", "--tls-ca", "ca.pem", "--token-file", "t"}, ""},
		{[]string{"--broker", "127.0.0.1:7070", "--spawn-secure"}, "--spawn-secure needs --spawn-brokers"},
		{[]string{"--spawn-brokers", "1", "--spawn-secure", "--tls-ca", "ca.pem"}, "no --tls-* or --token-file"},
		{[]string{"--broker", "127.0.0.1:7070", "--token-file", "t"}, "--token-file needs --tls-ca"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := parseFlags(tt.args, io.Discard)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want no error", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}
