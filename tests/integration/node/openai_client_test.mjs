// The official `openai` npm client against `relay serve` (issue 19): a
// two-turn chat with log-probs in one episode, a streamed call, and error
// cases, with the returned log-probs checked against `relay score` of the
// same token ids. Run by ../openai_client_test.sh, which installs the client.
//
//   node openai_client_test.mjs RELAY_BINARY SOURCE_DIR
//
// Prints one line per case; exits 1 when any fails.

import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync, existsSync, readFileSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';

const [relay, sourceDir] = process.argv.slice(2);
const config = join(sourceDir, 'configs', 'tiny.yaml');
const base = mkdtempSync(join(tmpdir(), 'relay_openai_'));
const failed = [];

function check(cond, what) {
  if (!cond) throw new Error(what);
}

async function testCase(name, fn) {
  try {
    const detail = await fn();
    console.log(`PASS ${name}${detail ? ': ' + detail : ''}`);
  } catch (e) {
    failed.push(name);
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

// GPT-2's byte -> symbol table (printable Latin-1 as itself, the rest from
// U+0100 on), so byte b is token b; then the ChatML specials 256-258.
function byteTokenizer() {
  const vocab = {};
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    vocab[String.fromCodePoint(printable ? b : next++)] = b;
  }
  const specials = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'];
  return {
    version: '1.0',
    added_tokens: specials.map((content, i) => ({
      id: 256 + i, content, special: true, lstrip: false, rstrip: false, normalized: false,
      single_word: false,
    })),
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null,
    decoder: { type: 'ByteLevel' },
    model: { type: 'BPE', dropout: null, ignore_merges: false, vocab, merges: [] },
  };
}

// A small random model with a byte-level ChatML tokenizer.
const model = join(base, 'model');
execFileSync(relay, ['init', config, '--out', model, 'model.init.vocab=259',
  'model.init.max_seq_len=512']);
unlinkSync(join(model, 'relay_tokenizer.json'));
writeFileSync(join(model, 'tokenizer.json'), JSON.stringify(byteTokenizer()));

const portFile = join(base, 'port');
const server = spawn(relay, ['serve', config, '--model', model, '--listen', '127.0.0.1:0',
  '--port-file', portFile, '--model-name', 'tiny', 'model.chat_template=auto'],
{ stdio: ['ignore', 'pipe', 'pipe'] });
let serverOutput = '';
server.stdout.on('data', (d) => { serverOutput += d; });
server.stderr.on('data', (d) => { serverOutput += d; });
const exited = new Promise((resolve) => server.on('exit', (code) => resolve(code)));

for (let i = 0; i < 600 && !existsSync(portFile); i++) {
  if (server.exitCode !== null) break;
  await new Promise((r) => setTimeout(r, 100));
}
if (!existsSync(portFile)) {
  console.log(`FAIL relay serve did not start:\n${serverOutput}`);
  process.exit(1);
}
const baseURL = `http://127.0.0.1:${readFileSync(portFile, 'utf8').trim()}/v1`;
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0 });

// log p(token) of `ids` after `prompt`, from `relay score` at temperature 1.
function scored(prompt, ids) {
  const out = execFileSync(relay, ['score', '--model', model, '--ids',
    [...prompt, ...ids].join(','), '--json']);
  const lp = JSON.parse(out).logprobs;
  return ids.map((_, j) => lp[prompt.length - 1 + j]);
}

function expectScored(prompt, choice) {
  const ids = choice.token_ids;
  const entries = choice.logprobs.content;
  check(entries.length === ids.length, `${entries.length} logprobs for ${ids.length} token ids`);
  const want = scored(prompt, ids);
  for (let j = 0; j < ids.length; j++) {
    check(Math.abs(entries[j].logprob - want[j]) < 1e-4,
      `token ${j}: logprob ${entries[j].logprob}, relay score ${want[j]}`);
    check(Array.isArray(entries[j].bytes), `token ${j}: no bytes`);
  }
  return ids.length;
}

await testCase('models lists the served model', async () => {
  const list = await client.models.list();
  check(list.data.length === 1 && list.data[0].id === 'tiny', JSON.stringify(list.data));
});

await testCase('a two-turn chat in one episode, log-probs equal relay score', async () => {
  const episode = new OpenAI({
    baseURL, apiKey: 'unused', maxRetries: 0, defaultHeaders: { 'X-Relay-Episode-Id': 'node-1' },
  });
  const messages = [{ role: 'user', content: 'What is 6*7?' }];
  const first = await episode.chat.completions.create({
    model: 'tiny', messages, logprobs: true, max_tokens: 12, temperature: 1, seed: 4,
  });
  check(first.object === 'chat.completion', first.object);
  check(first.episode_id === 'node-1', `episode_id ${first.episode_id}`);
  const n1 = expectScored(first.prompt_token_ids, first.choices[0]);
  check(first.usage.completion_tokens === n1, JSON.stringify(first.usage));
  messages.push({ role: 'assistant', content: first.choices[0].message.content });
  messages.push({ role: 'user', content: 'Are you sure?' });
  const second = await episode.chat.completions.create({
    model: 'tiny', messages, logprobs: true, max_tokens: 12, temperature: 1, seed: 5,
  });
  const before = [...first.prompt_token_ids, ...first.choices[0].token_ids];
  check(second.prompt_token_ids.slice(0, before.length).join(',') === before.join(','),
    'the second prompt does not begin with the first call\'s tokens as sampled');
  const n2 = expectScored(second.prompt_token_ids, second.choices[0]);
  const end = await fetch(`${baseURL}/episodes/node-1/end`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ reward: 1 }),
  });
  const ended = await end.json();
  check(end.status === 200 && ended.calls === 2, JSON.stringify(ended));
  check(ended.response_tokens === second.prompt_token_ids.length - first.prompt_token_ids.length + n2,
    JSON.stringify(ended));
  return `${n1} + ${n2} tokens checked`;
});

await testCase('a streamed call carries the non-streamed tokens', async () => {
  const request = {
    model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 16, seed: 9,
  };
  const whole = await client.chat.completions.create(request);
  const stream = await client.chat.completions.create({
    ...request, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  const ids = [];
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
      ids.push(...(c.token_ids || []));
    }
  }
  check(text === whole.choices[0].message.content,
    `streamed ${JSON.stringify(text)} != ${JSON.stringify(whole.choices[0].message.content)}`);
  check(ids.join(',') === whole.choices[0].token_ids.join(','), 'token ids differ');
  check(finish === whole.choices[0].finish_reason, `finish ${finish}`);
  check(usage && usage.completion_tokens === ids.length, JSON.stringify(usage));
  return `${ids.length} tokens`;
});

await testCase('errors come back as the client\'s error classes', async () => {
  try {
    await client.chat.completions.create({ model: 'gpt-4', messages: [{ role: 'user', content: 'x' }] });
    throw new Error('no error for an unknown model');
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError, `got ${e.constructor.name}: ${e.message}`);
    check(e.code === 'model_not_found', `code ${e.code}`);
  }
  try {
    await client.chat.completions.create({
      model: 'tiny', messages: [{ role: 'user', content: 'x' }], temperature: 5,
    });
    throw new Error('no error for temperature 5');
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError, `got ${e.constructor.name}: ${e.message}`);
    check(e.param === 'temperature', `param ${e.param}`);
  }
});

server.kill('SIGTERM');
const code = await exited;
if (code !== 0) {
  failed.push('relay serve exit');
  console.log(`FAIL relay serve exited with ${code} on SIGTERM:\n${serverOutput}`);
} else {
  console.log('PASS relay serve stops on SIGTERM');
}
if (failed.length) {
  console.log(`openai_client_test: ${failed.length} failed; files kept in ${base}\n${serverOutput}`);
  process.exit(1);
}
rmSync(base, { recursive: true, force: true });
