// REST and WebSocket access, with the token (if the server wants one).

const TOKEN_KEY = "cayuga.token";

export class AuthError extends Error {}

export class ApiError extends Error {
  constructor(message, status, data) {
    super(message);
    this.status = status;
    this.data = data;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export async function api(method, path, body) {
  const headers = {};
  if (body !== undefined) headers["content-type"] = "application/json";
  if (token()) headers.authorization = `Bearer ${token()}`;
  const response = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) throw new AuthError("the server wants a token");
  const data = response.status === 204 ? null : await response.json().catch(() => null);
  if (!response.ok) {
    throw new ApiError((data && data.detail) || `${response.status} ${response.statusText}`, response.status, data);
  }
  return data;
}

export function wsUrl(path, params = {}) {
  const url = new URL(path, location.href);
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
  return url.href;
}

// A browser's WebSocket cannot send an Authorization header: the token goes in
// a subprotocol, "cayuga.bearer.<base64url of the token>", beside "cayuga",
// which the server picks. Never in the URL, where logs and proxies would keep it.
export function wsProtocols() {
  if (!token()) return [];
  let binary = "";
  for (const byte of new TextEncoder().encode(token())) binary += String.fromCharCode(byte);
  const b64url = btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  return ["cayuga", `cayuga.bearer.${b64url}`];
}
