//! The console's routes-and-jobs page, from a plain HTTP client against a real sidecar
//! and redis-server: an operator signs in, sees the async route running, pauses it
//! through the confirmation page (deliveries are then acknowledged but wait in the
//! queue), resumes it (they reach the application), and starts a redrive job from the
//! form. Every form needs the session's CSRF token; the JSON API shows the effect.

use std::time::Duration;

use crate::common::admin::*;
use crate::common::*;

/// A second, sync route beside the async one.
const SYNC_ROUTE: &str = "sy";
const SYNC_PATH: &str = "/webhooks/sy";

/// The hidden CSRF field's value in a page.
fn csrf_of(html: &str) -> String {
    html.split("name=csrf value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or_else(|| panic!("a CSRF token in the form: {html}"))
        .to_string()
}

/// The `<tr>` of one route on the routes page.
fn route_row<'a>(html: &'a str, route: &str) -> &'a str {
    let start = html
        .find(&format!("data-route=\"{route}\""))
        .unwrap_or_else(|| panic!("route {route} is listed: {html}"));
    let rest = &html[start..];
    &rest[..rest.find("</tr>").unwrap()]
}

/// A signed-in console client: the session cookie and requests that carry it.
struct Console<'a> {
    sc: &'a Sidecar,
    client: reqwest::Client,
    session: String,
}

impl Console<'_> {
    async fn sign_in(sc: &Sidecar) -> Console<'_> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let form = client
            .get(sc.admin_url("/admin/login"))
            .send()
            .await
            .unwrap();
        let login_cookie = form.headers()["set-cookie"].to_str().unwrap().to_string();
        let login_cookie = login_cookie.split(';').next().unwrap().to_string();
        let csrf = csrf_of(&form.text().await.unwrap());
        let ok = client
            .post(sc.admin_url("/admin/login"))
            .header("cookie", &login_cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("csrf={csrf}&token={TOKEN}"))
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status().as_u16(), 303);
        let cookie = ok.headers()["set-cookie"].to_str().unwrap().to_string();
        assert!(cookie.starts_with("idemgate_session="), "{cookie}");
        Console {
            sc,
            client,
            session: cookie.split(';').next().unwrap().to_string(),
        }
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let r = self
            .client
            .get(self.sc.admin_url(path))
            .header("cookie", &self.session)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn post(&self, path: &str, body: &str) -> (u16, String) {
        let r = self
            .client
            .post(self.sc.admin_url(path))
            .header("cookie", &self.session)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }
}

/// `route`'s entry in `GET /admin/routes` (the bearer-token JSON API).
async fn route_json(sc: &Sidecar, route: &str) -> serde_json::Value {
    let a = api(sc, "GET", "/admin/routes", Some(TOKEN)).await;
    assert_eq!(a.status, 200, "{}", a.json);
    a.json["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["route"] == route)
        .unwrap_or_else(|| panic!("{route} in {}", a.json))
        .clone()
}

#[tokio::test]
async fn an_operator_pauses_resumes_and_starts_a_job_from_the_console() {
    let redis = RedisServer::start_new();
    let upstream = Upstream::start().await;
    let mut b = builder(&upstream, &redis)
        .route(RouteCfg::standard(SYNC_ROUTE, SYNC_PATH))
        .extra("[async]\n");
    b.routes[0].extra = "keep_payload = true\nmode = \"async\"\n".into();
    let sc = b.start().await;
    let c = Console::sign_in(&sc).await;

    // The list links to the page; the page shows both routes, neither paused.
    let (status, list) = c.get("/admin/").await;
    assert_eq!(status, 200);
    assert!(list.contains("href=\"/admin/routes-page\""), "{list}");
    let (status, page) = c.get("/admin/routes-page").await;
    assert_eq!(status, 200);
    let row = route_row(&page, ROUTE);
    assert!(row.contains("<td>async</td><td>no</td>"), "{row}");
    assert!(row.contains(&format!("id=\"pause-{ROUTE}\"")), "{row}");
    let row = route_row(&page, SYNC_ROUTE);
    assert!(row.contains("<td>sync</td><td>no</td>"), "{row}");
    assert!(
        !row.contains("confirm?action="),
        "no pause on a sync route: {row}"
    );
    assert_eq!(route_json(&sc, ROUTE).await["paused"], false);

    // Pause: a POST without the CSRF token, or with a wrong one, is refused and
    // changes nothing.
    let pause = format!("/admin/routes-page/{ROUTE}/pause");
    for body in ["", "csrf=0123456789abcdef0123456789abcdef"] {
        let (status, html) = c.post(&pause, body).await;
        assert_eq!(status, 403, "{html}");
        assert!(html.contains("CSRF check failed"), "{html}");
    }
    assert_eq!(route_json(&sc, ROUTE).await["paused"], false);
    // Without a session the page is not shown.
    let r = c
        .client
        .get(sc.admin_url("/admin/routes-page"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/admin/login");

    // Through the confirmation page it goes through.
    let (status, confirm) = c
        .get(&format!("/admin/routes-page/{ROUTE}/confirm?action=pause"))
        .await;
    assert_eq!(status, 200);
    assert!(
        confirm.contains(&format!("action=\"/admin/routes-page/{ROUTE}/pause\"")),
        "{confirm}"
    );
    assert_eq!(
        route_json(&sc, ROUTE).await["paused"],
        false,
        "nothing changes before confirming"
    );
    let csrf = csrf_of(&confirm);
    let (status, done) = c.post(&pause, &format!("csrf={csrf}")).await;
    assert_eq!(status, 200, "{done}");
    assert!(done.contains("is paused now"), "{done}");
    assert!(
        done.contains("href=\"/admin/routes-page\""),
        "a link back: {done}"
    );
    assert_eq!(route_json(&sc, ROUTE).await["paused"], true);

    // Paused: a delivery is acknowledged but waits in the queue.
    let d = Delivery::fresh();
    let ack = sc.send(&d).await;
    assert_eq!(ack.status, 200, "{ack:?}");
    upstream
        .assert_count_stays(0, Duration::from_millis(800))
        .await;
    let (_, page) = c.get("/admin/routes-page").await;
    let row = route_row(&page, ROUTE);
    assert!(row.contains("<td>async</td><td>yes</td>"), "{row}");
    assert!(row.contains("<td class=num>1</td>"), "queue depth 1: {row}");
    assert!(row.contains(&format!("id=\"resume-{ROUTE}\"")), "{row}");

    // A sync route cannot be paused: the result page says so.
    let (_, confirm) = c
        .get(&format!(
            "/admin/routes-page/{SYNC_ROUTE}/confirm?action=pause"
        ))
        .await;
    let (status, refused) = c
        .post(
            &format!("/admin/routes-page/{SYNC_ROUTE}/pause"),
            &format!("csrf={}", csrf_of(&confirm)),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    assert!(refused.contains("not_async"), "{refused}");
    assert_eq!(route_json(&sc, SYNC_ROUTE).await["paused"], false);

    // Resume: the waiting delivery reaches the application.
    let (status, confirm) = c
        .get(&format!("/admin/routes-page/{ROUTE}/confirm?action=resume"))
        .await;
    assert_eq!(status, 200);
    let resume = format!("/admin/routes-page/{ROUTE}/resume");
    let (status, _) = c.post(&resume, "csrf=wrong").await;
    assert_eq!(status, 403);
    assert_eq!(route_json(&sc, ROUTE).await["paused"], true);
    let (status, done) = c
        .post(&resume, &format!("csrf={}", csrf_of(&confirm)))
        .await;
    assert_eq!(status, 200, "{done}");
    assert!(done.contains("is resumed now"), "{done}");
    assert_eq!(route_json(&sc, ROUTE).await["paused"], false);
    upstream.wait_for_count(1, Duration::from_secs(10)).await;
    assert_eq!(upstream.last().body, d.body);

    // A redrive job from the form: confirmation (only the redrive's non-empty fields
    // make the filter), a POST without the token is refused, then it starts.
    let (status, page) = c.get("/admin/routes-page").await;
    assert_eq!(status, 200);
    assert!(page.contains("No jobs."), "{page}");
    assert!(
        page.contains("action=\"/admin/jobs-page/confirm\""),
        "{page}"
    );
    let (status, confirm) = c
        .get(&format!(
            "/admin/jobs-page/confirm?kind=redrive&route={ROUTE}&error_contains=&older_than=1h\
             &status=completed&outcome=&since=&until="
        ))
        .await;
    assert_eq!(status, 200, "{confirm}");
    assert!(confirm.contains("Start a redrive job"), "{confirm}");
    assert!(
        confirm.contains("name=\"older_than\" value=\"1h\""),
        "{confirm}"
    );
    assert!(!confirm.contains("name=\"status\""), "{confirm}");
    let csrf = csrf_of(&confirm);
    let form = format!("kind=redrive&route={ROUTE}&older_than=1h");
    let (status, _) = c.post("/admin/jobs-page/start", &form).await;
    assert_eq!(status, 403);
    let jobs = api(&sc, "GET", "/admin/jobs", Some(TOKEN)).await;
    assert_eq!(
        jobs.json["jobs"].as_array().map(Vec::len),
        Some(0),
        "{}",
        jobs.json
    );

    let (status, done) = c
        .post("/admin/jobs-page/start", &format!("csrf={csrf}&{form}"))
        .await;
    assert_eq!(status, 200, "{done}");
    assert!(done.contains("started (0 items)"), "{done}");
    let id = done
        .split("Job <code>")
        .nth(1)
        .and_then(|s| s.split("</code>").next())
        .expect("the job's id")
        .to_string();
    assert!(!id.is_empty());
    let job = api(&sc, "GET", &format!("/admin/jobs/{id}"), Some(TOKEN)).await;
    assert_eq!(job.status, 200, "{}", job.json);
    assert_eq!(job.json["kind"], "redrive");
    assert_eq!(job.json["route"], ROUTE);
    assert_eq!(job.json["total"], 0);
    assert_eq!(
        job.json["filter"],
        serde_json::json!({ "older_than": "1h" })
    );

    // The job is listed on the page, and has a page of its own; it ends done.
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, page) = c.get("/admin/routes-page").await;
        let start = page
            .find(&format!("data-job=\"{id}\""))
            .unwrap_or_else(|| panic!("job {id} is listed: {page}"));
        let row = &page[start..];
        let row = &row[..row.find("</tr>").unwrap()];
        assert!(row.contains("<td>redrive</td>"), "{row}");
        assert!(row.contains(&format!("<td>{ROUTE}</td>")), "{row}");
        assert!(row.contains("0 / 0"), "{row}");
        if row.contains(">done<") {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "the job never ended: {row}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, job_page) = c.get(&format!("/admin/job/{id}")).await;
    assert_eq!(status, 200);
    assert!(
        job_page.contains(&id) && job_page.contains(">done<"),
        "{job_page}"
    );
    assert!(
        !job_page.contains("id=restart"),
        "a done job is not started again"
    );
    // Starting a done job again is refused.
    let (_, confirm) = c.get(&format!("/admin/job/{id}/confirm")).await;
    let (status, refused) = c
        .post(
            &format!("/admin/job/{id}/restart"),
            &format!("csrf={}", csrf_of(&confirm)),
        )
        .await;
    assert_eq!(status, 409, "{refused}");
    assert!(refused.contains("the job is done"), "{refused}");

    // A redrive on the sync route is refused with the reason; no job is added.
    let (status, refused) = c
        .post(
            "/admin/jobs-page/start",
            &format!("csrf={csrf}&kind=redrive&route={SYNC_ROUTE}"),
        )
        .await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused.contains("is not async"), "{refused}");
    let jobs = api(&sc, "GET", "/admin/jobs", Some(TOKEN)).await;
    assert_eq!(
        jobs.json["jobs"].as_array().map(Vec::len),
        Some(1),
        "{}",
        jobs.json
    );

    wait_until(Duration::from_secs(5), "the audit lines", || {
        let log = sc.stderr();
        log.contains("action=\"pause\"") && log.contains("action=\"job\"")
    })
    .await;
}
