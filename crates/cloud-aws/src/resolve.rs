//! An EC2NodeClass's selector terms resolved against EC2: its subnets (with their zones), security
//! groups and images (the newest per architecture), and the instance profile.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::Filter;
use aws_sdk_ec2::Client;

use crate::nodeclass::{Alias, AmiSelectorTerm, EC2NodeClassSpec, ResolvedAmi, ResolvedSecurityGroup, ResolvedSubnet, SelectorTerm};
use crate::sdk_error;

/// What a node class resolved to. `problems` lists each selector that matched nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolved {
    pub subnets: Vec<ResolvedSubnet>,
    pub security_groups: Vec<ResolvedSecurityGroup>,
    pub amis: Vec<ResolvedAmi>,
    pub instance_profile: Option<String>,
    pub problems: Vec<String>,
}

impl Resolved {
    pub fn ready(&self) -> bool {
        self.problems.is_empty()
    }

    /// The image for an architecture (`amd64`/`arm64`).
    pub fn ami(&self, arch: &str) -> Option<&ResolvedAmi> {
        self.amis.iter().find(|a| a.arch == arch)
    }

    /// Subnets of a zone, the one with the most free addresses first.
    pub(crate) fn subnets_in(&self, zone: &str) -> Vec<&ResolvedSubnet> {
        let mut s: Vec<&ResolvedSubnet> = self.subnets.iter().filter(|s| s.zone == zone).collect();
        s.sort_by_key(|s| std::cmp::Reverse(s.available_ips.unwrap_or(0)));
        s
    }
}

/// EC2's architecture name for a Kubernetes one, and back.
pub(super) fn ec2_arch(arch: &str) -> &'static str {
    if arch == "arm64" {
        "arm64"
    } else {
        "x86_64"
    }
}

pub(super) fn kube_arch(ec2: &str) -> Option<&'static str> {
    match ec2 {
        "x86_64" => Some("amd64"),
        "arm64" => Some("arm64"),
        _ => None,
    }
}

/// Filters for a term's tags (`*` matches any value).
fn tag_filters(tags: &BTreeMap<String, String>) -> Vec<Filter> {
    tags.iter()
        .map(|(k, v)| if v == "*" { Filter::builder().name("tag-key").values(k).build() } else { Filter::builder().name(format!("tag:{k}")).values(v).build() })
        .collect()
}

pub async fn resolve(ec2: &Client, spec: &EC2NodeClassSpec, ami_owners: &[String]) -> Result<Resolved, String> {
    let mut r = Resolved::default();
    for term in &spec.subnet_selector_terms {
        let found = subnets(ec2, term).await?;
        if found.is_empty() {
            r.problems.push(format!("subnetSelectorTerm {} matched no subnet", describe(term)));
        }
        r.subnets.extend(found);
    }
    for term in &spec.security_group_selector_terms {
        let found = security_groups(ec2, term).await?;
        if found.is_empty() {
            r.problems.push(format!("securityGroupSelectorTerm {} matched no security group", describe(term)));
        }
        r.security_groups.extend(found);
    }
    let mut images: Vec<ResolvedAmi> = Vec::new();
    for term in &spec.ami_selector_terms {
        let found = amis(ec2, term, ami_owners).await?;
        if found.is_empty() {
            r.problems.push(format!("amiSelectorTerm {} matched no image", describe_ami(term)));
        }
        images.extend(found);
    }
    // The newest image per architecture.
    images.sort_by(|a, b| a.arch.cmp(&b.arch).then_with(|| b.creation_date.cmp(&a.creation_date)).then_with(|| a.id.cmp(&b.id)));
    images.dedup_by(|a, b| a.arch == b.arch);
    r.amis = images;
    r.subnets.sort();
    r.subnets.dedup();
    r.security_groups.sort();
    r.security_groups.dedup();
    for (what, empty) in [("subnetSelectorTerms", spec.subnet_selector_terms.is_empty()), ("securityGroupSelectorTerms", spec.security_group_selector_terms.is_empty()), ("amiSelectorTerms", spec.ami_selector_terms.is_empty())] {
        if empty {
            r.problems.push(format!("{what} is empty"));
        }
    }
    // A `role` gets its instance profile from `profile::ensure` (it needs IAM).
    r.instance_profile = spec.instance_profile.clone();
    if r.instance_profile.is_none() && spec.role.is_none() {
        r.problems.push("neither role nor instanceProfile is set".into());
    }
    Ok(r)
}

fn describe(t: &SelectorTerm) -> String {
    serde_json::to_string(t).unwrap_or_default()
}

fn describe_ami(t: &AmiSelectorTerm) -> String {
    serde_json::to_string(t).unwrap_or_default()
}

async fn subnets(ec2: &Client, term: &SelectorTerm) -> Result<Vec<ResolvedSubnet>, String> {
    let mut req = ec2.describe_subnets().set_filters(Some(tag_filters(&term.tags)));
    if let Some(id) = &term.id {
        req = req.subnet_ids(id);
    }
    let mut out = Vec::new();
    let mut pages = req.into_paginator().send();
    while let Some(page) = pages.next().await {
        for s in page.map_err(sdk_error)?.subnets() {
            if let (Some(id), Some(zone)) = (s.subnet_id(), s.availability_zone()) {
                out.push(ResolvedSubnet { id: id.into(), zone: zone.into(), zone_id: s.availability_zone_id().map(String::from), available_ips: s.available_ip_address_count() });
            }
        }
    }
    Ok(out)
}

async fn security_groups(ec2: &Client, term: &SelectorTerm) -> Result<Vec<ResolvedSecurityGroup>, String> {
    let mut filters = tag_filters(&term.tags);
    if let Some(name) = &term.name {
        filters.push(Filter::builder().name("group-name").values(name).build());
    }
    let mut req = ec2.describe_security_groups().set_filters(Some(filters));
    if let Some(id) = &term.id {
        req = req.group_ids(id);
    }
    let mut out = Vec::new();
    let mut pages = req.into_paginator().send();
    while let Some(page) = pages.next().await {
        for g in page.map_err(sdk_error)?.security_groups() {
            if let Some(id) = g.group_id() {
                out.push(ResolvedSecurityGroup { id: id.into(), name: g.group_name().map(String::from) });
            }
        }
    }
    Ok(out)
}

async fn amis(ec2: &Client, term: &AmiSelectorTerm, alias_owners: &[String]) -> Result<Vec<ResolvedAmi>, String> {
    // (name pattern, owners, architecture filter) queries for this term.
    let mut queries: Vec<(Option<String>, Vec<String>, Option<&str>)> = Vec::new();
    if let Some(alias) = &term.alias {
        let a = Alias::parse(alias)?;
        for arch in ["amd64", "arm64"] {
            queries.push((Some(a.name_pattern(arch)), alias_owners.to_vec(), Some(ec2_arch(arch))));
        }
    } else {
        queries.push((term.name.clone(), term.owner.iter().cloned().collect(), None));
    }
    let mut out = Vec::new();
    for (name, owners, arch) in queries {
        let mut filters = tag_filters(&term.tags);
        filters.push(Filter::builder().name("state").values("available").build());
        if let Some(n) = name {
            filters.push(Filter::builder().name("name").values(n).build());
        }
        if let Some(a) = arch {
            filters.push(Filter::builder().name("architecture").values(a).build());
        }
        let mut req = ec2.describe_images().set_filters(Some(filters)).set_owners((!owners.is_empty()).then_some(owners));
        if let Some(id) = &term.id {
            req = req.image_ids(id);
        }
        let resp = req.send().await.map_err(sdk_error)?;
        for i in resp.images() {
            let arch = i.architecture().and_then(|a| kube_arch(a.as_str()));
            if let (Some(id), Some(arch)) = (i.image_id(), arch) {
                out.push(ResolvedAmi { id: id.into(), name: i.name().map(String::from), arch: arch.into(), creation_date: i.creation_date().map(String::from) });
            }
        }
    }
    Ok(out)
}
