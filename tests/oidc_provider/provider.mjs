// The OpenID Connect provider the single sign-on tests start (tests/oidc_provider/__init__.py):
// the npm `oidc-provider` (certified, what many real deployments run) with a login page of its
// own, one confidential client and people read from a JSON file the test rewrites between
// sign-ins (a person's groups change at the provider: the next sign-in sees it).
//
//   node provider.mjs CONFIG.json
//
// CONFIG: {"client_id", "client_secret", "redirect_uris": [...], "post_logout_redirect_uris":
// [...], "users_file"}. The users file:
// {"<login>": {"sub", "password", "email", "name", "groups": [...]}, ...}, read at every login
// and every claims lookup. It listens on a free port of 127.0.0.1 and prints one JSON line,
// {"issuer": "http://127.0.0.1:PORT"}, once it answers. Nothing is fetched at run time.

import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';

import Provider from 'oidc-provider';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));

function people() {
  return JSON.parse(fs.readFileSync(config.users_file, 'utf8'));
}

function bySub(sub) {
  return Object.values(people()).find((person) => person.sub === sub);
}

function escape(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function loginPage(uid, error, login) {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Test identity provider: sign in</title></head><body>
<h1>Test identity provider</h1>
${error ? `<p role="alert" class="error">${escape(error)}</p>` : ''}
<form method="post" action="/interaction/${escape(uid)}/login" autocomplete="off">
<label for="login">Login</label> <input id="login" name="login" value="${escape(login || '')}" autofocus>
<label for="password">Password</label> <input id="password" name="password" type="password">
<button type="submit">Continue</button>
</form></body></html>`;
}

async function formBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
const signingKey = { ...privateKey.export({ format: 'jwk' }), kid: 'test-key-1', alg: 'RS256', use: 'sig' };

const server = http.createServer();
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: config.client_id,
    client_secret: config.client_secret,
    redirect_uris: config.redirect_uris,
    post_logout_redirect_uris: config.post_logout_redirect_uris || [],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
  }],
  jwks: { keys: [signingKey] },
  cookies: { keys: [crypto.randomBytes(32).toString('hex')] },
  scopes: ['openid', 'email', 'profile', 'groups'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  features: {
    devInteractions: { enabled: false },
    // RP-initiated sign-out (/session/end): a page of our own asks to confirm, as real
    // providers do; its form is the library's (with its CSRF field).
    rpInitiatedLogout: {
      enabled: true,
      async logoutSource(ctx, form) {
        ctx.body = `<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>Test identity provider: sign out</title></head><body>
<h1>Sign out of the test identity provider?</h1>
${form}
<button autofocus type="submit" form="op.logoutForm" value="yes" name="logout">Yes, sign me out</button>
<button type="submit" form="op.logoutForm">No, stay signed in</button>
</body></html>`;
      },
    },
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, sub) {
    if (!bySub(sub)) return undefined;
    return {
      accountId: sub,
      // Read again for every token and userinfo answer: the file is the directory.
      async claims() {
        const person = bySub(sub) || {};
        const login = Object.keys(people()).find((name) => people()[name].sub === sub);
        return {
          sub,
          email: person.email,
          email_verified: true,
          name: person.name || login,
          preferred_username: login,
          groups: person.groups || [],
        };
      },
    };
  },
});

async function interaction(req, res) {
  const match = req.url.match(/^\/interaction\/([^/?]+)(\/login)?/);
  const uid = match[1];
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) throw new Error('interaction mismatch');
  const { prompt, params, session, grantId } = details;

  if (match[2] && req.method === 'POST') {
    const body = await formBody(req);
    const person = people()[body.get('login')];
    if (!person || person.password !== body.get('password')) {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
      res.end(loginPage(uid, 'Unknown login or wrong password.', body.get('login')));
      return;
    }
    await provider.interactionFinished(req, res, { login: { accountId: person.sub } },
      { mergeWithLastSubmission: false });
    return;
  }
  if (prompt.name === 'login') {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
    res.end(loginPage(uid));
    return;
  }
  // Consent: a first-party client, granted what it asks without a page.
  const grant = grantId
    ? await provider.Grant.find(grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  if (prompt.details.missingOIDCScope) grant.addOIDCScope(prompt.details.missingOIDCScope.join(' '));
  if (prompt.details.missingOIDCClaims) grant.addOIDCClaims(prompt.details.missingOIDCClaims);
  const saved = await grant.save();
  await provider.interactionFinished(req, res, { consent: grantId ? {} : { grantId: saved } },
    { mergeWithLastSubmission: true });
}

const callback = provider.callback();
server.on('request', (req, res) => {
  if (req.url.startsWith('/interaction/')) {
    interaction(req, res).catch((error) => {
      res.writeHead(400, { 'content-type': 'text/plain' });
      res.end(`interaction failed: ${error.message}`);
    });
    return;
  }
  callback(req, res);
});

process.on('SIGTERM', () => server.close(() => process.exit(0)));
process.stdout.write(`${JSON.stringify({ issuer })}\n`);
