//! The web console in a real headless Chromium: sign in through the form,
//! load the list (a screenshot is saved), open a delivery, press replay, confirm, and
//! see the application receive the request again. Also: the cookie's flags and the
//! CSRF check, from a plain HTTP client.
//!
//! Skips — loudly — only when Chromium is missing and `apt-get install -y chromium`
//! cannot provide it.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::admin::*;
use crate::common::browser::*;
use crate::common::*;

/// Where the list screenshot goes: `<target dir>/admin-list.png`.
fn screenshot_path() -> PathBuf {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(&tmp).join("admin-list.png")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_replays_a_delivery_from_the_web_page() {
    let chromium = match find_or_install_chromium() {
        Ok(b) => b,
        Err(why) => {
            eprintln!(
                "SKIPPED e2e_console: Chromium is not available and could not be installed: {why}"
            );
            println!(
                "SKIPPED e2e_console: Chromium is not available and could not be installed: {why}"
            );
            return;
        }
    };
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).start().await;

    // Some traffic: completed deliveries with copies, one the application refused.
    let mut keys = Vec::new();
    for i in 0..6 {
        let d = Delivery::fresh();
        if i == 3 {
            upstream.push_modes(vec![Mode::Status(500)]);
        }
        sc.send(&d).await;
        if i % 2 == 0 {
            sc.send(&d).await;
        }
        keys.push(d);
    }
    let target = keys[5].clone();
    let sent_before = upstream.count();

    let mut b = Browser::launch(&chromium).await;
    // Not signed in: the page sends the browser to the login form.
    b.navigate(&sc.admin_url("/admin/")).await;
    b.wait_for(
        "the login form",
        "document.querySelector('input[name=token]')",
    )
    .await;
    assert!(b.location().await.ends_with("/admin/login"));
    b.eval(&format!(
        "document.querySelector('input[name=token]').value = '{TOKEN}'; \
         document.querySelector('button[type=submit]').click(); true"
    ))
    .await;
    b.wait_for(
        "the list after signing in",
        &format!("document.body.innerText.includes('{}')", target.id),
    )
    .await;
    assert!(b.location().await.ends_with("/admin/"));
    let text = b.eval("document.body.innerText").await;
    let text = text.as_str().unwrap();
    for d in &keys {
        assert!(text.contains(&d.id), "the list shows {}", d.id);
    }
    let rows = b.eval("document.querySelector('tbody').innerText").await;
    let rows = rows.as_str().unwrap();
    assert!(
        rows.contains("released") && rows.contains("completed"),
        "{rows}"
    );
    assert!(
        b.eval("document.querySelectorAll('svg polyline').length > 0")
            .await
            == true
    );
    // JavaScript is not needed: the page has no script at all.
    assert!(b.eval("document.scripts.length").await == 0);

    let png = b.screenshot_png().await;
    assert!(png.starts_with(b"\x89PNG"));
    let path = screenshot_path();
    std::fs::write(&path, &png).unwrap();
    eprintln!("screenshot of the list: {}", path.display());
    if std::env::var_os("IDEMGATE_UPDATE_DOCS_SCREENSHOT").is_some() {
        let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/admin-list.png");
        std::fs::write(&docs, &png).unwrap();
    }

    // Open the delivery, press replay, confirm.
    b.eval(&format!(
        "Array.from(document.querySelectorAll('a')).find(a => a.textContent === '{}').click(); true",
        target.id
    ))
    .await;
    b.wait_for("the detail page", "document.querySelector('#replay')")
        .await;
    assert!(b.location().await.contains("/admin/view/"));
    let detail = b.eval("document.body.innerText").await;
    assert!(
        detail.as_str().unwrap().contains("resending is safe"),
        "{detail}"
    );
    b.eval("document.querySelector('#replay').click(); true")
        .await;
    b.wait_for(
        "the confirmation page",
        "document.querySelector('#confirm')",
    )
    .await;
    assert_eq!(
        upstream.count(),
        sent_before,
        "nothing is sent before confirming"
    );
    b.eval("document.querySelector('#confirm').click(); true")
        .await;
    b.wait_for("the replay's result", "document.querySelector('#done')")
        .await;
    let done = b.eval("document.querySelector('#done').innerText").await;
    assert!(done.as_str().unwrap().contains("answered 200"), "{done}");

    upstream
        .wait_for_count(sent_before + 1, Duration::from_secs(5))
        .await;
    let got = upstream.last();
    assert_eq!(got.body, target.body);
    assert_eq!(got.path_and_query, PATH);
    upstream
        .assert_count_stays(sent_before + 1, Duration::from_millis(200))
        .await;
    wait_until(Duration::from_secs(5), "the audit line", || {
        sc.stderr().contains("who=\"admin\" action=\"replay\"")
    })
    .await;
}

#[tokio::test]
async fn the_cookie_is_httponly_strict_and_forms_need_the_csrf_token() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).start().await;
    let d = Delivery::fresh();
    sc.send(&d).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // The login form carries a CSRF token, doubled in a cookie.
    let form = client
        .get(sc.admin_url("/admin/login"))
        .send()
        .await
        .unwrap();
    let login_cookie = form.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(login_cookie.contains("HttpOnly") && login_cookie.contains("SameSite=Strict"));
    let login_cookie = login_cookie.split(';').next().unwrap().to_string();
    let html = form.text().await.unwrap();
    let login_csrf = html
        .split("name=csrf value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a CSRF token in the login form")
        .to_string();
    let login = |body: String, with_cookie: bool| {
        let mut rb = client
            .post(sc.admin_url("/admin/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        if with_cookie {
            rb = rb.header("cookie", &login_cookie);
        }
        rb.send()
    };
    let bad = login(
        format!("csrf={login_csrf}&token=wrong-token-wrong-token"),
        true,
    )
    .await
    .unwrap();
    assert_eq!(bad.status().as_u16(), 401);
    assert!(
        !bad.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("idemgate_session")
    );
    // The right token without the CSRF cookie (a cross-site form) is refused.
    let forged = login(format!("csrf={login_csrf}&token={OPS_TOKEN}"), false)
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 401);

    let ok = login(format!("csrf={login_csrf}&token={OPS_TOKEN}"), true)
        .await
        .unwrap();
    assert_eq!(ok.status().as_u16(), 303);
    let cookie = ok.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_string();

    let path = format!(
        "/admin/view/{ROUTE}/{}",
        percent_encoding::utf8_percent_encode(&d.id, percent_encoding::NON_ALPHANUMERIC)
    );
    // A form post without (or with a wrong) CSRF token is refused and sends nothing.
    for body in ["", "csrf=0123456789abcdef0123456789abcdef"] {
        let r = client
            .post(sc.admin_url(&format!("{path}/replay")))
            .header("cookie", &session)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403);
    }
    assert_eq!(upstream.count(), 1);
    // Without a session, pages send to the login form.
    let r = client.get(sc.admin_url(&path)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/admin/login");
    // With it, the confirmation page carries the token, and the post goes through.
    let page = client
        .get(sc.admin_url(&format!("{path}/confirm?action=forget")))
        .header("cookie", &session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = page
        .split("name=csrf value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a CSRF token in the form")
        .to_string();
    let r = client
        .post(sc.admin_url(&format!("{path}/forget")))
        .header("cookie", &session)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("csrf={csrf}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let again = sc.send(&d).await;
    assert!(!again.replayed(), "forgotten: the next copy is forwarded");
    assert_eq!(upstream.count(), 2);
}

/// Signs `b` in to `sc`'s console through the login form and waits for the list.
async fn sign_in(b: &mut Browser, sc: &Sidecar) {
    b.navigate(&sc.admin_url("/admin/")).await;
    b.wait_for(
        "the login form",
        "document.querySelector('input[name=token]')",
    )
    .await;
    b.eval(&format!(
        "document.querySelector('input[name=token]').value = '{TOKEN}'; \
         document.querySelector('button[type=submit]').click(); true"
    ))
    .await;
    b.wait_for("the list", "document.querySelector('form.filters')")
        .await;
}

/// The keys the list's table shows.
async fn listed(b: &mut Browser) -> Vec<String> {
    let v = b
        .eval("Array.from(document.querySelectorAll('tbody td:nth-child(2) code')).map(c => c.textContent)")
        .await;
    v.as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect()
}

/// Fills the filter form (`name` → value; a checkbox takes `true`), submits it, and
/// waits for the page it leads to.
async fn search(b: &mut Browser, fields: &[(&str, &str)]) {
    let mut js = String::from(
        "document.querySelectorAll('form.filters input').forEach(i => { if (i.type === 'checkbox') i.checked = false; else i.value = ''; });",
    );
    for (name, value) in fields {
        js.push_str(&format!(
            "{{ const i = document.querySelector('form.filters [name={name}]'); \
             if (i.type === 'checkbox') i.checked = ('{value}' === 'true'); else i.value = '{value}'; }}"
        ));
    }
    js.push_str("window.searched = true; document.querySelector('form.filters button[type=submit]').click(); true");
    let done = b.eval(&js).await;
    assert_eq!(done, true, "the form could not be filled: {js}");
    b.wait_for(
        "the searched page",
        "!window.searched && document.readyState === 'complete' && document.querySelector('form.filters')",
    )
    .await;
}

/// The filter form: a search by upstream status class, by copies, by first-seen time
/// and by key prefix shows what it says; its URL carries the search, so opening the
/// link again (or paging on) shows the same; a bad value says which field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_searches_deliveries_and_shares_the_search_as_a_link() {
    let chromium = match find_or_install_chromium() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("SKIPPED e2e_console search: Chromium is not available: {why}");
            println!("SKIPPED e2e_console search: Chromium is not available: {why}");
            return;
        }
    };
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let sc = builder(&upstream, &redis).start().await;
    // Four deliveries: 0 and 2 copied, 3 refused by the application (500).
    let mut ds = Vec::new();
    for i in 0..4 {
        let d = Delivery::fresh();
        if i == 3 {
            upstream.push_modes(vec![Mode::Status(500)]);
        }
        sc.send(&d).await;
        if i % 2 == 0 {
            assert!(sc.send(&d).await.replayed());
        }
        ds.push(d.id);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let list = api(&sc, "GET", "/admin/deliveries", Some(TOKEN)).await;
    let first_seen = |id: &str| {
        list.json["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == id)
            .and_then(|e| e["first_seen"].as_u64())
            .unwrap()
    };

    let mut b = Browser::launch(&chromium).await;
    sign_in(&mut b, &sc).await;
    assert_eq!(listed(&mut b).await.len(), 4);

    search(&mut b, &[("upstream_status", "5xx")]).await;
    assert_eq!(listed(&mut b).await, [ds[3].clone()]);
    let link = b.location().await;
    assert!(link.contains("upstream_status=5xx"), "{link}");

    search(&mut b, &[("duplicates", "true")]).await;
    assert_eq!(listed(&mut b).await, [ds[2].clone(), ds[0].clone()]);

    let since = first_seen(&ds[1]).to_string();
    let until = first_seen(&ds[3]).to_string();
    search(&mut b, &[("since", &since), ("until", &until)]).await;
    assert_eq!(listed(&mut b).await, [ds[2].clone(), ds[1].clone()]);

    search(&mut b, &[("key_prefix", &ds[1])]).await;
    assert_eq!(listed(&mut b).await, [ds[1].clone()]);

    // The shared link: the same search, its field filled in.
    b.navigate(&link).await;
    b.wait_for(
        "the shared search",
        "document.querySelector('form.filters')",
    )
    .await;
    assert_eq!(listed(&mut b).await, [ds[3].clone()]);
    let field = b
        .eval("document.querySelector('form.filters [name=upstream_status]').value")
        .await;
    assert_eq!(field, "5xx");

    // Paging on keeps the search.
    b.navigate(&sc.admin_url("/admin/?duplicates=true&limit=1"))
        .await;
    b.wait_for("the first page", "document.querySelector('form.filters')")
        .await;
    assert_eq!(listed(&mut b).await, [ds[2].clone()]);
    let older = b
        .eval("Array.from(document.querySelectorAll('a')).find(a => a.textContent.startsWith('Older')).href")
        .await;
    let older = older.as_str().unwrap().to_string();
    assert!(older.contains("duplicates=true"), "{older}");
    b.navigate(&older).await;
    b.wait_for("the next page", "document.querySelector('form.filters')")
        .await;
    assert_eq!(listed(&mut b).await, [ds[0].clone()]);

    // A bad value: the page says which field.
    search(&mut b, &[("since", "yesterday")]).await;
    let warn = b.eval("document.querySelector('p.warn').innerText").await;
    assert!(warn.as_str().unwrap().starts_with("since:"), "{warn}");
}
