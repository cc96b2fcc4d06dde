package connections

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"credbroker/binding"
	"credbroker/internal/outage"
	"credbroker/internal/untrusted"
	"credbroker/provider"
	"credbroker/vault"
)

// Errors. Front doors turn them into their own answers through Explain
// (one classification for every door); Describe gives the words.
var (
	// ErrUnknownRequest: no such connect request for this person, call
	// and provider (also: someone else's). Never says which.
	ErrUnknownRequest = errors.New("connections: no such connect request")
	// ErrRequestExpired: the connect request expired before it completed.
	ErrRequestExpired = errors.New("connections: the connect request expired")
	// ErrTooManyRounds: the client retried one connect request too often
	// (the limit binding keeps).
	ErrTooManyRounds = binding.ErrTooManyRounds
	// ErrTooManyPending: the person has too many open connect requests.
	ErrTooManyPending = binding.ErrTooManyPending
	// ErrRateLimited: the person started too many connect requests recently.
	ErrRateLimited = binding.ErrRateLimited
	// ErrTooManyKeys: as many keys were checked for this connection's
	// replacement as a connect link may check (ReplaceKey); nothing was
	// sent.
	ErrTooManyKeys = binding.ErrTooManyAttempts
	// ErrConnectionGone: the connection a completed request made was
	// deleted since.
	ErrConnectionGone = errors.New("connections: the connection made by this request no longer exists")
	// ErrExportDisabled: the provider's tokens are not handed out (its
	// entry does not allow it, or its kind has no tokens to hand out).
	ErrExportDisabled = errors.New("connections: token export is disabled for this provider")
)

// ChoiceError: the person's answer to "which account?" (Perform's account
// choice) names none of their usable accounts, or no account at all.
// Nothing was sent.
type ChoiceError struct {
	Provider *provider.Provider
	// Answer is the person's answer; Chosen the account it named.
	Answer Answer
	Chosen string
}

func (e *ChoiceError) Error() string {
	switch e.Answer {
	case Decline, Cancel:
		return fmt.Sprintf("No request was sent: the user did not choose a %s account.", e.Provider.DisplayName)
	case NoAnswer:
		return "The account choice was not answered. No request was sent."
	}
	return fmt.Sprintf("The chosen account %s is not a connected %s account. No request was sent.", untrusted.Quote(e.Chosen), e.Provider.DisplayName)
}

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
	if _, form := e.Provider.Kind.(provider.FormStep); form {
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
// What the caller should do next (Failure.Next) is the front door's to
// say, in its own terms.
func Describe(err error, p *provider.Provider) string {
	name := "the provider"
	form := false
	if p != nil {
		name = p.DisplayName
		_, form = p.Kind.(provider.FormStep)
	}
	var re *provider.RequestError
	var kr *provider.KeyRefusedError
	var kf *provider.KeyFormatError
	var ue *provider.UninspectableError
	switch {
	case errors.Is(err, vault.ErrUnavailable):
		return outage.Message
	case isA[*UnknownProviderError](err), isA[*ScopeError](err), isA[*AccountError](err), isA[*KeyAccountError](err),
		isA[*ChoiceError](err), isA[*GatewayOnlyError](err), isA[*NotAGatewayError](err), isA[*provider.UpstreamError](err),
		isA[*NoBrowserStepError](err):
		return err.Error()
	case errors.Is(err, ErrTooManyStepUps):
		return fmt.Sprintf("%s kept asking for more permissions; no new connect request was started. Try again later.", name)
	case errors.Is(err, ErrScopesHeld):
		return fmt.Sprintf("%s refused the call (HTTP 403) although the connected account already grants every permission it named; connecting again would not help. Ask %s's administrator about this account's access.", name, name)
	case errors.As(err, &kr):
		return fmt.Sprintf("The key was refused by %s (%d). Nothing was stored.", name, kr.Status)
	case errors.As(err, &kf):
		return kf.Error() + ". Nothing was sent to " + name + " and nothing was stored."
	case errors.Is(err, provider.ErrNotAToken), errors.Is(err, ErrExportDisabled) && form:
		return fmt.Sprintf("%s uses an API key, which is never handed out.", name)
	case errors.Is(err, provider.ErrRegistrationDropped):
		return fmt.Sprintf("%s no longer knows the broker's registration; connect again (the broker registers anew).", name)
	case errors.Is(err, provider.ErrNeedsReconnect) && form:
		return fmt.Sprintf("Your %s key was rejected (revoked or expired at %s); enter a new one.", name, name)
	case errors.As(err, &re):
		return "Request refused: " + re.Msg + ". Nothing was sent."
	case errors.Is(err, ErrRequestExpired):
		return fmt.Sprintf("The connect request for %s expired before it was completed.", name)
	case errors.Is(err, ErrTooManyRounds):
		return fmt.Sprintf("The connect request for %s was retried too many times without being completed.", name)
	case errors.Is(err, ErrTooManyKeys):
		return fmt.Sprintf("Too many keys were tried for this %s connection. Nothing was sent to %s; try again in a few minutes.", name, name)
	case errors.Is(err, ErrTooManyPending):
		return "Too many connect requests are open for this user. Finish or let the earlier connect links expire, then try again."
	case errors.Is(err, ErrRateLimited):
		return "Too many connect requests were started in the last hour. Try again later."
	case errors.Is(err, ErrConnectionGone):
		return fmt.Sprintf("The %s connection made through this request no longer exists. Connect again.", name)
	case errors.Is(err, ErrUnknownRequest):
		return "Invalid or expired requestState"
	case errors.Is(err, ErrExportDisabled):
		return fmt.Sprintf("Handing out %s tokens is disabled (an operator can allow it with sidecar_token_export: true in providers.yaml).", name)
	case errors.Is(err, provider.ErrNeedsReconnect):
		return fmt.Sprintf("The %s access was revoked or has expired; the account must be reconnected.", name)
	case errors.As(err, &ue):
		return fmt.Sprintf("%s answered in a form the broker cannot check for secrets (%s), so nothing of the answer was returned.", name, ue.Detail())
	case errors.Is(err, provider.ErrUninspectableAnswer):
		return fmt.Sprintf("%s answered in a form the broker cannot check for secrets, so nothing of the answer was returned.", name)
	case errors.Is(err, provider.ErrProviderUnavailable):
		return fmt.Sprintf("%s did not answer properly (timeouts or server errors, after retries). Nothing was changed; try again later.", name)
	case errors.Is(err, vault.ErrNotFound):
		return fmt.Sprintf("The %s connection no longer exists. Connect again.", name)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("The request to %s was cancelled or timed out.", name)
	}
	return fmt.Sprintf("The request to %s failed inside the broker. Nothing was returned.", name)
}

// Class is what kind of failure an error is. Every front door maps a
// class to its own wire (a JSON-RPC code, an HTTP status) instead of
// listing errors.
type Class int

const (
	// Internal: a failure inside the broker; logged, never shown.
	Internal Class = iota
	// BadRequest: the call is malformed or asks for what is not allowed.
	BadRequest
	// BadState: a continuation (requestState) that does not belong to
	// this call; one answer whatever the reason.
	BadState
	// NotFound: the call names a provider the broker does not have.
	NotFound
	// NeedsConnection: there is no usable connection to act with.
	NeedsConnection
	// Refused: not now: a limit, or a connect request that expired, was
	// retried too often or whose connection is gone.
	Refused
	// Forbidden: never, by policy (tokens that are not handed out).
	Forbidden
	// Conflict: what is stored disagrees with the call (a key of another
	// account).
	Conflict
	// Unavailable: the provider did not answer properly.
	Unavailable
	// TimedOut: the call was cancelled or ran out of time.
	TimedOut
	// StorageUnavailable: the broker's store could not be used (the
	// database down or restarting, the disk full): retry in a few seconds
	// (outage.RetryAfter). The cause is for the log only.
	StorageUnavailable
)

// Code is a failure's stable name, which the sidecar API publishes as its
// error code (docs/sidecar.openapi.yaml).
type Code string

// Codes.
const (
	CodeInternal            Code = "internal"
	CodeInvalidRequest      Code = "invalid_request"
	CodeRequestRefused      Code = "request_refused"
	CodeInvalidState        Code = "invalid_request_state"
	CodeUnknownProvider     Code = "unknown_provider"
	CodeNotConnected        Code = "not_connected"
	CodeNeedsReconnect      Code = "needs_reconnect"
	CodeRefused             Code = "refused"
	CodeExportDisabled      Code = "token_export_disabled"
	CodeConflict            Code = "conflict"
	CodeProviderUnavailable Code = "provider_unavailable"
	CodeAnswerRefused       Code = "provider_answer_refused"
	CodeStorageUnavailable  Code = "storage_unavailable"
)

// Codes lists every Code, for the documents that publish them.
func Codes() []Code {
	return []Code{CodeInternal, CodeInvalidRequest, CodeRequestRefused, CodeInvalidState, CodeUnknownProvider, CodeNotConnected,
		CodeNeedsReconnect, CodeRefused, CodeExportDisabled, CodeConflict, CodeProviderUnavailable, CodeAnswerRefused,
		CodeStorageUnavailable}
}

// Next is what the caller can do about a failure, which each front door
// says in its own terms.
type Next int

const (
	// NextNone: nothing in particular.
	NextNone Next = iota
	// NextStartOver: begin the call again without its continuation.
	NextStartOver
	// NextConnect: connect the provider first.
	NextConnect
	// NextReconnect: connect the provider again.
	NextReconnect
)

// Failure is how a front door answers an error.
type Failure struct {
	Class Class
	Code  Code
	// Message is Describe's: words for the person or the model.
	Message string
	// Accounts lists the person's accounts when the call must name one.
	Accounts []string
	Next     Next
}

// isA reports whether err's tree holds an error of type E.
func isA[E error](err error) bool {
	_, ok := errors.AsType[E](err)
	return ok
}

// Classify returns err's class.
func Classify(err error) Class { return Explain(err, nil).Class }

// Explain classifies err (p, the provider concerned, may be nil) for a
// front door: one classification for every door.
func Explain(err error, p *provider.Provider) Failure {
	f := Failure{Message: Describe(err, p)}
	var ae *AccountError
	var ce *ChoiceError
	switch {
	case errors.Is(err, vault.ErrUnavailable):
		// First: whatever else the error says, the store could not be used.
		f.Class, f.Code = StorageUnavailable, CodeStorageUnavailable
	case isA[*UnknownProviderError](err), isA[*NotAGatewayError](err):
		f.Class, f.Code = NotFound, CodeUnknownProvider
	case isA[*GatewayOnlyError](err):
		f.Class, f.Code = BadRequest, CodeRequestRefused
	case errors.Is(err, ErrTooManyStepUps), errors.Is(err, ErrScopesHeld):
		f.Class, f.Code = Refused, CodeRefused
	case isA[*ScopeError](err), isA[*provider.KeyFormatError](err), isA[*provider.KeyRefusedError](err), isA[*NoBrowserStepError](err):
		f.Class, f.Code = BadRequest, CodeInvalidRequest
	case errors.As(err, &ce):
		f.Class, f.Code = BadRequest, CodeInvalidRequest
		if ce.Answer == NoAnswer {
			f.Next = NextStartOver
		}
	case isA[*provider.RequestError](err):
		f.Class, f.Code = BadRequest, CodeRequestRefused
	case errors.Is(err, ErrUnknownRequest):
		f.Class, f.Code = BadState, CodeInvalidState
	case errors.As(err, &ae):
		f.Class, f.Code, f.Accounts = NeedsConnection, CodeNotConnected, ae.Accounts
	case errors.Is(err, provider.ErrNeedsReconnect), errors.Is(err, provider.ErrRegistrationDropped):
		f.Class, f.Code, f.Next = NeedsConnection, CodeNeedsReconnect, NextReconnect
	case errors.Is(err, vault.ErrNotFound):
		f.Class, f.Code, f.Next = NeedsConnection, CodeNotConnected, NextConnect
	case errors.Is(err, ErrRequestExpired), errors.Is(err, ErrTooManyRounds):
		f.Class, f.Code, f.Next = Refused, CodeRefused, NextStartOver
	case errors.Is(err, ErrTooManyPending), errors.Is(err, ErrRateLimited), errors.Is(err, ErrConnectionGone), errors.Is(err, ErrTooManyKeys):
		f.Class, f.Code = Refused, CodeRefused
	case errors.Is(err, ErrExportDisabled), errors.Is(err, provider.ErrNotAToken):
		f.Class, f.Code = Forbidden, CodeExportDisabled
	case isA[*KeyAccountError](err):
		f.Class, f.Code = Conflict, CodeConflict
	case errors.Is(err, provider.ErrUninspectableAnswer):
		f.Class, f.Code = Unavailable, CodeAnswerRefused
	case errors.Is(err, provider.ErrProviderUnavailable):
		f.Class, f.Code = Unavailable, CodeProviderUnavailable
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		f.Class, f.Code = TimedOut, CodeProviderUnavailable
	default:
		f.Class, f.Code = Internal, CodeInternal
	}
	return f
}
