//! The default `worker_threads`: one delivery runtime per CPU the container may use,
//! from its cgroup's CPU quota, so a sidecar limited to one core runs one runtime and
//! one given two runs two without being told.

/// cgroup v2's quota and period, `"max 100000"` (no quota) or `"200000 100000"`.
const CPU_MAX_V2: &str = "/sys/fs/cgroup/cpu.max";
/// cgroup v1's quota (`-1` = none) and period, in µs.
const CFS_QUOTA_V1: &str = "/sys/fs/cgroup/cpu/cpu.cfs_quota_us";
const CFS_PERIOD_V1: &str = "/sys/fs/cgroup/cpu/cpu.cfs_period_us";

/// What the cgroup files say, as read (each `None` when the file is absent).
#[derive(Debug, Default, Clone, Copy)]
pub struct CgroupCpu<'a> {
    /// The contents of v2's `cpu.max`.
    pub cpu_max: Option<&'a str>,
    /// The contents of v1's `cpu.cfs_quota_us`.
    pub cfs_quota_us: Option<&'a str>,
    /// The contents of v1's `cpu.cfs_period_us`.
    pub cfs_period_us: Option<&'a str>,
}

impl CgroupCpu<'_> {
    /// The CPUs the quota allows, rounded up (1.5 CPUs = 2); `None` when there is no
    /// quota or the files say nothing readable. v2 is asked first.
    pub fn quota_cpus(&self) -> Option<usize> {
        let v2 = self.cpu_max.and_then(|s| {
            let mut parts = s.split_whitespace();
            let quota = parts.next()?;
            let period = parts.next().unwrap_or("100000");
            Some((quota.parse::<u64>().ok(), period.parse::<u64>().ok()?))
        });
        let (quota, period) = match v2 {
            Some((quota, period)) => (quota?, period),
            None => {
                // v1: a quota of -1 (or anything not a positive number) is no quota.
                let quota = self.cfs_quota_us?.trim().parse::<u64>().ok()?;
                let period = self.cfs_period_us?.trim().parse::<u64>().ok()?;
                (quota, period)
            }
        };
        if quota == 0 || period == 0 {
            return None;
        }
        usize::try_from(quota.div_ceil(period)).ok()
    }

    /// The default number of delivery runtimes: the quota's CPUs, capped by the CPUs
    /// the process may run on (`available`), at least 1.
    pub fn worker_threads(&self, available: usize) -> usize {
        let available = available.max(1);
        self.quota_cpus()
            .map_or(available, |q| q.min(available))
            .max(1)
    }
}

/// The default `worker_threads` on this machine: this cgroup's quota, capped by
/// `std::thread::available_parallelism()`.
pub fn default_worker_threads() -> usize {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let (cpu_max, quota, period) = (read(CPU_MAX_V2), read(CFS_QUOTA_V1), read(CFS_PERIOD_V1));
    let cgroup = CgroupCpu {
        cpu_max: cpu_max.as_deref(),
        cfs_quota_us: quota.as_deref(),
        cfs_period_us: period.as_deref(),
    };
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    cgroup.worker_threads(available)
}

#[cfg(test)]
mod tests {
    use super::CgroupCpu;

    fn v2(s: &str) -> CgroupCpu<'_> {
        CgroupCpu {
            cpu_max: Some(s),
            ..CgroupCpu::default()
        }
    }

    fn v1<'a>(quota: &'a str, period: &'a str) -> CgroupCpu<'a> {
        CgroupCpu {
            cfs_quota_us: Some(quota),
            cfs_period_us: Some(period),
            ..CgroupCpu::default()
        }
    }

    #[test]
    fn the_v2_quota_rounds_up_to_whole_cpus() {
        assert_eq!(v2("200000 100000\n").quota_cpus(), Some(2));
        assert_eq!(v2("150000 100000\n").quota_cpus(), Some(2));
        assert_eq!(v2("50000 100000\n").quota_cpus(), Some(1));
        assert_eq!(v2("100000 100000").quota_cpus(), Some(1));
        assert_eq!(v2("400000 50000\n").quota_cpus(), Some(8));
    }

    #[test]
    fn no_quota_means_every_available_cpu() {
        assert_eq!(v2("max 100000\n").quota_cpus(), None);
        assert_eq!(v2("max 100000\n").worker_threads(4), 4);
        assert_eq!(CgroupCpu::default().worker_threads(3), 3);
        assert_eq!(v1("-1", "100000").quota_cpus(), None);
        assert_eq!(v1("-1\n", "100000\n").worker_threads(2), 2);
        // unreadable contents are no quota, not an error
        assert_eq!(v2("").quota_cpus(), None);
        assert_eq!(v2("lots 100000").worker_threads(2), 2);
        assert_eq!(v2("0 100000").worker_threads(2), 2);
    }

    #[test]
    fn the_v1_quota_is_read_when_there_is_no_v2_file() {
        assert_eq!(v1("250000\n", "100000\n").quota_cpus(), Some(3));
        assert_eq!(v1("100000", "100000").worker_threads(8), 1);
    }

    #[test]
    fn v2_is_asked_first() {
        let both = CgroupCpu {
            cpu_max: Some("100000 100000"),
            cfs_quota_us: Some("400000"),
            cfs_period_us: Some("100000"),
        };
        assert_eq!(both.quota_cpus(), Some(1));
    }

    #[test]
    fn the_default_is_capped_by_the_cpus_available_and_is_at_least_one() {
        assert_eq!(v2("800000 100000").worker_threads(2), 2);
        assert_eq!(v2("200000 100000").worker_threads(16), 2);
        assert_eq!(v2("max 100000").worker_threads(0), 1);
        assert_eq!(v2("1000 100000").worker_threads(4), 1);
    }
}
