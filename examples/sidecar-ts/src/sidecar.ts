// A small client for credbroker's sidecar API (docs/sidecar.openapi.yaml in
// the broker's repository). It sends the server's secret and the person's
// bearer token to the sidecar only, never follows redirects, and holds no
// OAuth code and no provider token.

/** A connection, described: never a token. */
export interface Connection {
  id: string;
  provider: string;
  account: string;
  scopes: string[];
  status: 'active' | 'needs_reconnect';
  /** Scopes asked for that the person did not grant (with note only). */
  not_granted?: string[];
  /** Which scopes were not granted and how to ask again. */
  note?: string;
}

/** The url elicitation the broker asks the MCP host to show. */
export interface InputRequest {
  method: 'elicitation/create';
  params: { mode: 'url'; message: string; url: string };
}

export interface RequireRequest {
  provider: string;
  scopes?: string[];
  /** On the host's retry: the requestState it echoed. */
  request_state?: string;
  /** On the host's retry: its inputResponses, passed on as they came. */
  input_responses?: Record<string, unknown>;
  /** The host's self-asserted name, shown to the person as not verified. */
  client_name?: string;
}

export type RequireResult =
  | { status: 'connected'; connection: Connection }
  | { status: 'input_required'; input_key: string; input_request: InputRequest; request_state: string }
  | { status: 'declined' | 'cancelled'; message: string };

/** A refusal of the broker's own (the Error schema). */
export class SidecarError extends Error {
  readonly status: number;
  readonly code: string;
  readonly accounts: string[];

  constructor(status: number, code: string, message: string, accounts: string[] = []) {
    super(message);
    this.name = 'SidecarError';
    this.status = status;
    this.code = code;
    this.accounts = accounts;
  }
}

export class Sidecar {
  readonly #base: string;
  readonly #secret: string;

  /** base is the sidecar API's URL, e.g. http://127.0.0.1:8081. */
  constructor(base: string, secret: string) {
    if (!secret) {
      throw new Error('the sidecar secret is required');
    }
    const u = new URL(base);
    if (u.protocol !== 'http:' && u.protocol !== 'https:') {
      throw new Error(`${base} is not an http(s) URL`);
    }
    this.#base = base.replace(/\/+$/, '');
    this.#secret = secret;
  }

  #fetch(userToken: string, path: string, init: RequestInit): Promise<Response> {
    const headers = new Headers(init.headers);
    headers.set('Broker-Sidecar-Secret', this.#secret);
    headers.set('Authorization', `Bearer ${userToken}`);
    // A provider's 3xx comes back as it is: credentials never follow it.
    return fetch(this.#base + path, { ...init, headers, redirect: 'manual' });
  }

  static async #refusal(resp: Response): Promise<SidecarError> {
    const text = await resp.text();
    try {
      const e = JSON.parse(text) as { error?: string; message?: string; accounts?: string[] };
      if (e.error) {
        return new SidecarError(resp.status, e.error, e.message ?? '', e.accounts);
      }
    } catch {
      // not JSON: reported below
    }
    return new SidecarError(resp.status, 'http_error', `HTTP ${resp.status}`);
  }

  /** Makes sure the person has connected a provider (POST /v1/require). */
  async require(userToken: string, req: RequireRequest): Promise<RequireResult> {
    const resp = await this.#fetch(userToken, '/v1/require', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(req),
    });
    if (resp.status !== 200) {
      throw await Sidecar.#refusal(resp);
    }
    return (await resp.json()) as RequireResult;
  }

  /**
   * Calls the provider's API as the person (/v1/proxy/{provider}{path}):
   * the provider's answer, whatever its status. The broker's own refusals
   * (Broker-Error: true) are thrown as SidecarError.
   */
  async proxy(userToken: string, provider: string, path: string, init: RequestInit & { account?: string } = {}): Promise<Response> {
    const { account, ...rest } = init;
    const headers = new Headers(rest.headers);
    if (account) {
      headers.set('Broker-Account', account);
    }
    const resp = await this.#fetch(userToken, `/v1/proxy/${encodeURIComponent(provider)}${path}`, { ...rest, headers });
    if (resp.headers.get('Broker-Error') === 'true') {
      throw await Sidecar.#refusal(resp);
    }
    return resp;
  }
}
