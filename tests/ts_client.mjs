// An MCP client on the TypeScript SDK 1.x (the handshake-era protocol), driven by
// tests/test_ts_client.py: connects with a bearer token, lists tools, makes the calls given as
// JSON on argv[4], and prints one JSON line per call with what the SDK gave back.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [, , url, token, calls] = process.argv;
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "haltwire-ts-test", version: "1.0.0" });
await client.connect(transport);
const tools = await client.listTools();
console.log(JSON.stringify({ tools: tools.tools.map((t) => t.name).sort() }));
for (const call of JSON.parse(calls)) {
  try {
    const result = await client.callTool({ name: call.name, arguments: call.arguments });
    console.log(JSON.stringify({ result }));
  } catch (error) {
    console.log(JSON.stringify({ error: { code: error.code, message: String(error.message) } }));
  }
}
await client.close();
