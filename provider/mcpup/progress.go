package mcpup

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// OnProgress routes the upstream progress notifications carrying token (a
// token the caller minted and put in the request's _meta.progressToken) to
// fn until the returned stop is called. Tokens are the caller's to keep
// unique; notifications for unknown tokens are dropped.
func (p *Pool) OnProgress(token string, fn func(*mcp.ProgressNotificationParams)) (stop func()) {
	p.progress.Store(token, fn)
	return func() { p.progress.Delete(token) }
}

// routeProgress is every session's progress notification handler.
func (p *Pool) routeProgress(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	if req == nil || req.Params == nil {
		return
	}
	token, ok := req.Params.ProgressToken.(string)
	if !ok {
		return
	}
	if fn, ok := p.progress.Load(token); ok {
		fn.(func(*mcp.ProgressNotificationParams))(req.Params)
	}
}
