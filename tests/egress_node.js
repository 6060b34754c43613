// A Node.js client of the egress proxy, with Node's built-in modules only (tests/test_egress_node.py).
// node egress_node.js MODE PROXY_PORT TARGET_HOST:PORT PATH [RUN:TOKEN]
//   MODE forward: GET http://TARGET/PATH through the proxy (an absolute URI);
//   MODE connect: CONNECT TARGET, then GET /PATH inside the tunnel.
// Prints one JSON line: {"status": N, "body": "..."} (the proxy's answer, or the target's).
"use strict";
const http = require("node:http");

const [mode, proxyPort, target, path, credentials] = process.argv.slice(2);
const headers = {};
if (credentials) {
  headers["Proxy-Authorization"] = "Basic " + Buffer.from(credentials).toString("base64");
}

function done(status, body) {
  process.stdout.write(JSON.stringify({ status, body }) + "\n");
}

function collect(res) {
  let body = "";
  res.setEncoding("utf8");
  res.on("data", (chunk) => { body += chunk; });
  res.on("end", () => done(res.statusCode, body));
}

const timer = setTimeout(() => { done(0, "timed out"); process.exit(2); }, 10000);
timer.unref();

if (mode === "forward") {
  const req = http.request({
    host: "127.0.0.1", port: Number(proxyPort), method: "GET",
    path: `http://${target}${path}`, headers: { ...headers, Host: target },
  }, collect);
  req.on("error", (err) => { done(0, String(err)); process.exitCode = 1; });
  req.end();
} else {
  const req = http.request({
    host: "127.0.0.1", port: Number(proxyPort), method: "CONNECT", path: target, headers,
  });
  req.on("connect", (res, socket, head) => {
    if (res.statusCode !== 200) {
      // A refused CONNECT: its JSON body follows the head, and the proxy then closes.
      let body = head.toString("utf8");
      socket.setEncoding("utf8");
      socket.on("data", (chunk) => { body += chunk; });
      socket.on("close", () => done(res.statusCode, body));
      return;
    }
    // The tunnel is a plain socket: a request to the target through it.
    const inner = http.request({
      createConnection: () => socket, method: "GET", path, headers: { Host: target },
    }, collect);
    inner.on("error", (err) => { done(0, String(err)); process.exitCode = 1; });
    inner.end();
  });
  req.on("error", (err) => { done(0, String(err)); process.exitCode = 1; });
  req.end();
}
