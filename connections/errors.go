package connections

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"credbroker/internal/untrusted"
	"credbroker/provider"
	"credbroker/vault"
)

// Errors. Front doors branch on them with errors.Is / errors.As and turn
// them into their own answers; Describe gives the words.
var (
	// ErrUnknownRequest: no such connect request for this person, call
	// and provider (also: someone else's). Never says which.
	ErrUnknownRequest = errors.New("connections: no such connect request")
	// ErrRequestExpired: the connect request expired before it completed.
	ErrRequestExpired = errors.New("connections: the connect request expired")
	// ErrTooManyRounds: the client retried one connect request too often.
	ErrTooManyRounds = errors.New("connections: too many retries for one connect request")
	// ErrTooManyPending: the person has too many open connect requests.
	ErrTooManyPending = errors.New("connections: too many open connect requests")
	// ErrRateLimited: the person started too many connect requests recently.
	ErrRateLimited = errors.New("connections: too many connect requests this hour")
	// ErrConnectionGone: the connection a completed request made was
	// deleted since.
	ErrConnectionGone = errors.New("connections: the connection made by this request no longer exists")
	// ErrExportDisabled: the provider does not allow token export.
	ErrExportDisabled = errors.New("connections: token export is disabled for this provider")
)

// UnknownProviderError: the name is not in the catalogue.
type UnknownProviderError struct {
	Name  string
	Known []string
}

func (e *UnknownProviderError) Error() string {
	return fmt.Sprintf("Unknown provider %s. Valid providers: %s.", untrusted.Quote(e.Name), strings.Join(e.Known, ", "))
}

// ScopeError: a requested scope is not allowed for the provider.
type ScopeError struct {
	Provider *provider.Provider
	Scope    string
}

func (e *ScopeError) Error() string {
	if e.Provider.IsAPIKey() {
		return fmt.Sprintf("Scope %s is not allowed for %s: it uses an API key, which has no scopes. Call again without scopes.",
			untrusted.Quote(e.Scope), e.Provider.Name)
	}
	allowed := "the provider's default scopes"
	if len(e.Provider.AllowedScopes) > 0 {
		allowed = strings.Join(e.Provider.AllowedScopes, ", ")
	}
	return fmt.Sprintf("Scope %s is not allowed for %s. Allowed scopes: %s.", untrusted.Quote(e.Scope), e.Provider.Name, allowed)
}

// AccountError: the caller must name (another) account.
type AccountError struct {
	Provider *provider.Provider
	// Named is the account the caller named ("" if none).
	Named string
	// Accounts are the person's accounts at the provider, sorted.
	Accounts []string
	// Several: several accounts match and none was named.
	Several bool
	// OtherConnected: the browser step connected another account than
	// the one named, which is still not connected.
	OtherConnected bool
}

func (e *AccountError) Error() string {
	name := e.Provider.DisplayName
	switch {
	case e.OtherConnected:
		return fmt.Sprintf("The %s account %s is still not connected (the browser step connected another account). Nothing was sent; connect %s and call again.",
			name, untrusted.Quote(e.Named), untrusted.Quote(e.Named))
	case e.Several:
		return fmt.Sprintf("Several %s accounts are connected; name one of: %s.", name, strings.Join(e.Accounts, ", "))
	case e.Named != "" && len(e.Accounts) > 0:
		return fmt.Sprintf("No %s connection for account %s. Connected accounts: %s.", name, untrusted.Quote(e.Named), strings.Join(e.Accounts, ", "))
	}
	return fmt.Sprintf("No %s account is connected.", name)
}

// Describe says what went wrong in words fit for the person or the model
// (never a token, never the internals of an unexpected failure): the
// message of a typed error, or a fixed sentence for the rest. p may be nil.
func Describe(err error, p *provider.Provider) string {
	name := "the provider"
	if p != nil {
		name = p.DisplayName
	}
	var up *UnknownProviderError
	var se *ScopeError
	var ae *AccountError
	var re *provider.RequestError
	var ke *KeyAccountError
	var kr *provider.KeyRefusedError
	var kf *provider.KeyFormatError
	switch {
	case errors.As(err, &up), errors.As(err, &se), errors.As(err, &ae), errors.As(err, &ke):
		return err.Error()
	case errors.As(err, &kr):
		return fmt.Sprintf("The key was refused by %s (%d). Nothing was stored.", name, kr.Status)
	case errors.As(err, &kf):
		return kf.Error() + ". Nothing was sent to " + name + " and nothing was stored."
	case errors.Is(err, provider.ErrNotAToken), errors.Is(err, ErrExportDisabled) && p != nil && p.IsAPIKey():
		return fmt.Sprintf("%s uses an API key, which is never handed out; use the proxy instead.", name)
	case errors.Is(err, provider.ErrNeedsReconnect) && p != nil && p.IsAPIKey():
		return fmt.Sprintf("Your %s key was rejected (revoked or expired at %s); enter a new one.", name, name)
	case errors.As(err, &re):
		return "Request refused: " + re.Msg + ". Nothing was sent."
	case errors.Is(err, ErrRequestExpired):
		return fmt.Sprintf("The connect request for %s expired before it was completed. Start over.", name)
	case errors.Is(err, ErrTooManyRounds):
		return fmt.Sprintf("The connect request for %s was retried too many times without being completed. Start over.", name)
	case errors.Is(err, ErrTooManyPending):
		return "Too many connect requests are open for this user. Finish or let the earlier connect links expire, then try again."
	case errors.Is(err, ErrRateLimited):
		return "Too many connect requests were started in the last hour. Try again later."
	case errors.Is(err, ErrConnectionGone):
		return fmt.Sprintf("The %s connection made through this request no longer exists. Connect again.", name)
	case errors.Is(err, ErrUnknownRequest):
		return "Invalid or expired requestState"
	case errors.Is(err, ErrExportDisabled):
		return fmt.Sprintf("Handing out %s tokens is disabled; use the proxy instead.", name)
	case errors.Is(err, provider.ErrNeedsReconnect):
		return fmt.Sprintf("The %s access was revoked or has expired; the account must be reconnected.", name)
	case errors.Is(err, provider.ErrUninspectableAnswer):
		return fmt.Sprintf("%s answered in a form the broker cannot check for secrets (%s), so nothing of the answer was returned.",
			name, strings.TrimPrefix(err.Error(), provider.ErrUninspectableAnswer.Error()+": "))
	case errors.Is(err, provider.ErrProviderUnavailable):
		return fmt.Sprintf("%s did not answer properly (timeouts or server errors, after retries). Nothing was changed; try again later.", name)
	case errors.Is(err, vault.ErrNotFound):
		return fmt.Sprintf("The %s connection no longer exists. Connect again.", name)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("The request to %s was cancelled or timed out.", name)
	}
	return fmt.Sprintf("The request to %s failed inside the broker. Nothing was returned.", name)
}
