package mcpup

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// OnProgress routes the upstream progress notifications carrying token (a
// token the caller minted and put in the request's _meta.progressToken) to
// fn until the returned stop is called: one at a time, in the order the
// upstream sent them, each before the request's answer is returned (they
// are read off the answer's event stream, see answers.go). Tokens are the
// caller's to keep unique; notifications for unknown tokens are dropped.
func (p *Pool) OnProgress(token string, fn func(*mcp.ProgressNotificationParams)) (stop func()) {
	p.progress.Store(token, fn)
	return func() { p.progress.Delete(token) }
}

// routeProgress hands an upstream's progress notification to its sink.
func (p *Pool) routeProgress(params *mcp.ProgressNotificationParams) {
	token, ok := params.ProgressToken.(string)
	if !ok {
		return
	}
	if fn, ok := p.progress.Load(token); ok {
		fn.(func(*mcp.ProgressNotificationParams))(params)
	}
}
