// Loaded with `node --import` before server-everything by cmd/broker's
// TestGatewayServerEverything. It changes nothing of what the server
// does with a request; it
//
//   - binds every listener that would take all interfaces (or none named)
//     to 127.0.0.1, and prints the bound address ("preload: listening on
//     127.0.0.1:PORT"), so PORT=0 takes a free port without a race;
//   - when EVERYTHING_INSTRUCTIONS_FILE is set, serves that file's text as
//     the server's instructions (the package reads docs/instructions.md);
//   - prints each JSON-RPC request the server's MCP layer receives, each
//     notifications/cancelled, and each request handler whose abort signal
//     fires, as one JSON line on stderr prefixed "preload: ".
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { syncBuiltinESMExports } from "node:module";
import { pathToFileURL } from "node:url";

const say = (what) => process.stderr.write("preload: " + (typeof what === "string" ? what : JSON.stringify(what)) + "\n");

// Loopback only.
const wildcard = (h) => h === undefined || h === null || h === "" || h === "0.0.0.0" || h === "::" || h === "[::]";
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const [first] = args;
  if (first !== null && typeof first === "object" && !("fd" in first) && !("path" in first)) {
    if (wildcard(first.host)) args[0] = { ...first, host: "127.0.0.1" };
  } else if (first === undefined || typeof first === "function") {
    args.unshift(0, "127.0.0.1");
  } else if (typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first))) {
    if (typeof args[1] !== "string") args.splice(1, 0, "127.0.0.1");
    else if (wildcard(args[1])) args[1] = "127.0.0.1";
  }
  this.once("listening", () => {
    const a = this.address();
    if (a && typeof a === "object") say(`listening on ${a.address}:${a.port}`);
  });
  return listen.apply(this, args);
};

// Injected instructions.
const instructions = process.env.EVERYTHING_INSTRUCTIONS_FILE;
if (instructions) {
  const readFileSync = fs.readFileSync;
  const target = path.join("docs", "instructions.md");
  fs.readFileSync = function (file, ...rest) {
    if (typeof file === "string" && file.endsWith(path.sep + target)) return readFileSync.call(this, instructions, ...rest);
    return readFileSync.call(this, file, ...rest);
  };
  syncBuiltinESMExports(); // `import { readFileSync } from "fs"` sees it
}

// What the MCP layer receives: the SDK the server resolves (the nearest
// node_modules above the entry point, as Node looks), its Protocol class.
function sdkProtocol() {
  for (let dir = path.dirname(path.resolve(process.argv[1])); ; dir = path.dirname(dir)) {
    const file = path.join(dir, "node_modules", "@modelcontextprotocol", "sdk", "dist", "esm", "shared", "protocol.js");
    if (fs.existsSync(file)) return file;
    if (path.dirname(dir) === dir) throw new Error("preload: no @modelcontextprotocol/sdk above " + process.argv[1]);
  }
}
const { Protocol } = await import(pathToFileURL(sdkProtocol()).href);
const onrequest = Protocol.prototype._onrequest;
Protocol.prototype._onrequest = function (request, extra) {
  const p = request.params ?? {};
  const session = this._transport?.sessionId;
  say({ event: "request", session, id: request.id, method: request.method, name: p.name ?? p.uri,
    arguments: p.arguments, progressToken: p._meta?.progressToken });
  const out = onrequest.call(this, request, extra);
  const controller = this._requestHandlerAbortControllers?.get(request.id);
  controller?.signal.addEventListener("abort", () => say({ event: "aborted", session, id: request.id }), { once: true });
  return out;
};
const oncancel = Protocol.prototype._oncancel;
Protocol.prototype._oncancel = function (notification) {
  const id = notification.params?.requestId;
  say({ event: "cancelled", session: this._transport?.sessionId, requestId: id, reason: notification.params?.reason,
    running: this._requestHandlerAbortControllers?.has(id) ?? false });
  return oncancel.call(this, notification);
};
say("ready");
