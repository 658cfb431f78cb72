output "client_service" {
  description = "The in-cluster REST URL of Cornus."
  value       = "http://${helm_release.cornus.name}.${helm_release.cornus.namespace}.svc.cluster.local:8100"
}

output "table_name" {
  description = "The DynamoDB table holding Cornus's records and data."
  value       = module.storage.table_name
}
