// A client nobody on kbflow wrote: the official TypeScript MCP SDK drives `kbflow mcp` over stdio.
// Usage: node client.mjs KBFLOW CONFIG CWD — prints what it saw as one JSON object.
// The SDK checks each tool result's structuredContent against the tool's outputSchema itself.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [kbflow, config, cwd] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: kbflow, args: ["mcp", "--config", config], cwd,
                                             env: { ...process.env }, stderr: "inherit" });
const client = new Client({ name: "kbflow-ts-test", version: "1.0.0" });
await client.connect(transport);
const out = {};
const tools = (await client.listTools()).tools;
out.outputSchemas = Object.fromEntries(tools.map((tool) => [tool.name, Boolean(tool.outputSchema)]));
out.added = (await client.callTool({ name: "add_text",
  arguments: { text: "Green tea is brewed at 80 degrees.", doc_id: "tea" } })).structuredContent;
const found = await client.callTool({ name: "search", arguments: { query: "how hot should tea water be", limit: 2 } });
out.hits = found.structuredContent.hits;
out.stats = (await client.callTool({ name: "stats", arguments: {} })).structuredContent;
out.namespaces = (await client.callTool({ name: "list_namespaces", arguments: {} })).structuredContent;
const bad = await client.callTool({ name: "search", arguments: { query: "tea", limit: 0 } });
out.bad = { isError: Boolean(bad.isError), text: bad.content[0].text };
const read = await client.readResource({ uri: `kbflow://default/${out.hits[0].doc_id}` });
out.document = read.contents[0].text;
out.prompts = (await client.listPrompts()).prompts.map((prompt) => prompt.name);
await client.close();
console.log(JSON.stringify(out));
