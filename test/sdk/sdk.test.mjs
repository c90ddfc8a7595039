// fusebox's own answers, and a streamed answer through it, read by the
// official SDKs as an application reads them. test/e2e/sdk_test.go starts
// fusebox behind envoysim and the fake providers, then runs this with the
// gateways' base URLs in the environment. Python's SDKs are not reachable
// here (no PyPI): the Node packages are the reference clients.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const urls = {
  default: process.env.FUSEBOX_SDK_DEFAULT,
  failfast: process.env.FUSEBOX_SDK_FAILFAST,
  retry: process.env.FUSEBOX_SDK_RETRY,
};

// counting wraps fetch to count the SDK's attempts.
function counting() {
  const c = { n: 0 };
  c.fetch = (...args) => { c.n++; return fetch(...args); };
  return c;
}

const openai = (gw, opts = {}) => new OpenAI({ apiKey: 'sk-test', baseURL: urls[gw] + '/v1', ...opts });
const anthropic = (gw, opts = {}) => new Anthropic({ apiKey: 'sk-ant-test', baseURL: urls[gw], ...opts });

test('openai: an unknown model is a NotFoundError with code model_not_found', async () => {
  await assert.rejects(openai('default', { maxRetries: 0 }).chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => {
      assert.ok(e instanceof OpenAI.NotFoundError, e.constructor.name);
      assert.equal(e.status, 404);
      assert.equal(e.code, 'model_not_found');
      assert.match(e.message, /model "nope" is not served by gateway "default"/);
      return true;
    });
});

test('anthropic: an unknown model is a NotFoundError with its type and message', async () => {
  await assert.rejects(anthropic('default', { maxRetries: 0 }).messages.create({ model: 'nope', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }),
    (e) => {
      assert.ok(e instanceof Anthropic.NotFoundError, e.constructor.name);
      assert.equal(e.status, 404);
      // Anthropic's own shape: the SDK reads type and message from it
      // (e.message is "404 " and the body, as for Anthropic's own errors).
      assert.equal(e.type, 'not_found_error');
      assert.match(e.apiMessage ?? '', /^model_not_found: model "nope" is not served by gateway "default"$/);
      return true;
    });
});

for (const [name, call, klass, check] of [
  ['openai', (c) => openai('failfast', { fetch: c.fetch }).chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }),
    OpenAI.InternalServerError, (e) => assert.equal(e.code, 'all_routes_open')],
  ['anthropic', (c) => anthropic('failfast', { fetch: c.fetch }).messages.create({ model: 'claude', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }),
    Anthropic.InternalServerError, (e) => { assert.equal(e.type, 'overloaded_error'); assert.match(e.apiMessage ?? '', /^all_routes_open: every route of model "claude" is unavailable/); }],
]) {
  test(`${name}: fail-fast returns in one attempt, with no sleep`, async () => {
    const c = counting();
    const t0 = Date.now();
    await assert.rejects(call(c), (e) => {
      assert.ok(e instanceof klass, e.constructor.name);
      assert.equal(e.status, 503);
      check(e);
      return true;
    });
    assert.equal(c.n, 1, 'attempts');
    assert.ok(Date.now() - t0 < 5000, `took ${Date.now() - t0} ms: the SDK slept on retry-after`);
  });
}

test('openai: with fail_fast_client_retry the SDK retries after retry-after', async () => {
  const c = counting();
  const t0 = Date.now();
  await assert.rejects(openai('retry', { fetch: c.fetch, maxRetries: 1 }).chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 503);
  assert.equal(c.n, 2, 'attempts');
  assert.ok(Date.now() - t0 >= 900, `retried after ${Date.now() - t0} ms, retry-after is 1 s`);
});

test('openai: a streamed answer through fusebox reads to its end', async () => {
  const stream = await openai('default').chat.completions.create({ model: 'gpt-4o-mini', stream: true, messages: [{ role: 'user', content: 'hi' }] });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.ok(text.trim().length > 0, 'no text');
  assert.equal(finish, 'stop');
});

test('anthropic: a streamed answer through fusebox reads to its end', async () => {
  const stream = anthropic('default').messages.stream({ model: 'claude', max_tokens: 64, messages: [{ role: 'user', content: 'hi' }] });
  const text = await stream.finalText();
  assert.ok(text.trim().length > 0, 'no text');
  const msg = await stream.finalMessage();
  assert.equal(msg.stop_reason, 'end_turn');
});
