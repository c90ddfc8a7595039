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
  nogateway: process.env.FUSEBOX_SDK_NOGATEWAY,
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

test('openai: an unknown gateway is a NotFoundError with code gateway_not_found', async () => {
  await assert.rejects(openai('nogateway', { maxRetries: 0 }).chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => {
      assert.ok(e instanceof OpenAI.NotFoundError, e.constructor.name);
      assert.equal(e.code, 'gateway_not_found');
      assert.match(e.message, /gateway "nope" is not configured/);
      return true;
    });
});

test('anthropic: an unknown gateway is a NotFoundError with its type and message', async () => {
  await assert.rejects(anthropic('nogateway', { maxRetries: 0 }).messages.create({ model: 'claude', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }),
    (e) => {
      assert.ok(e instanceof Anthropic.NotFoundError, e.constructor.name);
      assert.equal(e.type, 'not_found_error');
      assert.match(e.apiMessage ?? '', /^gateway_not_found: gateway "nope" is not configured$/);
      return true;
    });
});

// A body an SDK would never build (model given twice) sent through each
// SDK's own request method: the SDK still reads fusebox's 400.
test('openai: an invalid request is a BadRequestError with code invalid_request', async () => {
  await assert.rejects(openai('default', { maxRetries: 0 }).post('/chat/completions', {
    body: '{"model":"gpt-4o-mini","model":"x","messages":[]}', headers: { 'content-type': 'application/json' } }),
  (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, e.constructor.name);
    assert.equal(e.code, 'invalid_request');
    return true;
  });
});

test('anthropic: an invalid request is a BadRequestError with its type and message', async () => {
  await assert.rejects(anthropic('default', { maxRetries: 0 }).post('/v1/messages', {
    body: '{"model":"claude","model":"x","messages":[]}', headers: { 'content-type': 'application/json' } }),
  (e) => {
    assert.ok(e instanceof Anthropic.BadRequestError, e.constructor.name);
    assert.equal(e.type, 'invalid_request_error');
    assert.match(e.apiMessage ?? '', /^invalid_request: /);
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
